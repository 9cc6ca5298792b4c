"""The runner end to end: a real memrl-mcp over stdio, a scripted OpenAI-compatible LLM over HTTP."""

import json
import random
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks.base import Episode, Memory, Task
from memrl_harness.llm import LLM
from memrl_harness.results import Q_VALUES_FILE, RunConfig, RunDir
from memrl_harness.runner import ENV_MEMORY_TOKEN, RunError, Runner, epoch_order
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.harness.quiz import CAPITALS, MISSED, CapitalsQuiz
from tests.support.servers import http_server

# runs the harness end to end, with memrl-mcp servers: `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow


def answer(request: RecordedRequest) -> str:
    """The fake LLM: answers quiz questions (wrongly for Spain) and writes experiences."""
    text = request.last_user
    if text.startswith("Past experience:"):
        country = text.rsplit("of ", 1)[1].rstrip("?")
        return "Barcelona" if country == MISSED else CAPITALS[country]
    if text.rstrip().endswith("Steps:"):
        return "1. read the country 2. answer its capital"
    return "Barcelona is not the capital; check before answering"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["memrl", "rag", "none"])
async def test_a_run_learns_through_the_mcp_memory(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path, mode: str):
    fake_llm.responder = answer
    config = RunConfig(benchmark="capitals", mode=mode, epochs=2, seed=3, workers=2)
    run_dir = RunDir(tmp_path / "run")
    with anyio.fail_after(90):
        records = await Runner(config, CapitalsQuiz(), run_dir, llm).run()

    assert sorted((r.epoch, r.task_id) for r in records) == sorted(
        (e, f"capital-{c}") for e in (1, 2) for c in CAPITALS
    )
    assert {r.task_id: r.success for r in records} == {f"capital-{c}": c != MISSED for c in CAPITALS}
    assert all(r.task_type == "geo" and r.prompt_tokens > 0 and r.completion_tokens > 0 for r in records)
    for epoch in (1, 2):  # each epoch's records carry that epoch's seeded order
        order = [t.id for t in epoch_order(CapitalsQuiz().tasks(), 3, epoch)]
        assert sorted((r.position, r.task_id) for r in records if r.epoch == epoch) == list(enumerate(order))

    summaries = [r for r in fake_llm.chat_requests if not r.last_user.startswith("Past experience:")]
    second_epoch_prompts = [r.last_user for r in fake_llm.chat_requests if r.last_user.startswith("Past")][3:]
    if mode == "none":
        assert summaries == [] and all(r.recall_id is None and r.memory_ids == [] for r in records)
        assert all("none" in p for p in second_epoch_prompts)
        return
    # One experience per episode: a procedure for each success, a reflection for each failure.
    assert sorted(r.last_user.rstrip().endswith("Steps:") for r in summaries) == [False] * 2 + [True] * 4
    # Epoch 2's prompts carry epoch 1's experiences; the same task merges into one memory per outcome.
    assert all("[success] 1. read the country" in p for p in second_epoch_prompts)
    stored = {r.task_id: r.stored_id for r in records if r.epoch == 1}
    assert all(r.stored_id == stored[r.task_id] for r in records if r.epoch == 2)
    # Only memrl logs recalls (it reports each one); rag looks up read-only and leaves none unreported.
    assert all(bool(r.recall_id) == (mode == "memrl") for r in records)
    q_file = run_dir.path / Q_VALUES_FILE
    assert q_file.exists() == (mode == "memrl")


class CrashingQuiz(CapitalsQuiz):
    """Dies on its fourth episode, as a run killed in its second epoch."""

    def __init__(self) -> None:
        self.episodes = 0

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        self.episodes += 1
        if self.episodes == 4:
            raise RuntimeError("crash")
        return super().run_episode(task, memories, llm, rng)


@pytest.mark.anyio
async def test_resuming_a_run_runs_only_what_is_missing(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path):
    fake_llm.responder = answer
    run_dir = RunDir(tmp_path / "run")
    config = RunConfig(benchmark="capitals", mode="memrl", epochs=2, seed=1)
    with anyio.fail_after(60), pytest.raises(RunError, match=r"epoch 2, task capital-\w+: RuntimeError\('crash'\)"):
        await Runner(config, CrashingQuiz(), run_dir, llm).run()
    assert len(run_dir.episodes()) == 3
    # A kill mid-write leaves a torn line: it is cut, and that episode runs again.
    with run_dir.episodes_file.open("a") as out:
        out.write('{"epoch": 2, "position": 0, "task_id": "capi')
    asked = len(fake_llm.chat_requests)
    with anyio.fail_after(60):
        records = await Runner(config, CapitalsQuiz(), run_dir, llm).run()
    assert sorted((r.epoch, r.task_id) for r in records) == sorted(
        (e, f"capital-{c}") for e in (1, 2) for c in CAPITALS
    )
    assert len(fake_llm.chat_requests) - asked == 3 * 2  # epoch 2 only: an answer and an experience each


def test_a_run_folder_refuses_another_run(llm: LLM, tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    run_dir.write_config(RunConfig(benchmark="capitals", mode="rag", epochs=2))
    runner = Runner(RunConfig(benchmark="capitals", mode="memrl", epochs=2), CapitalsQuiz(), run_dir, llm)
    with pytest.raises(Exception, match="holds another run"):
        runner.prepare()


@pytest.mark.anyio
async def test_runs_share_one_token_protected_memory_server(
    fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A fleet: runs on one memrl-mcp HTTP server, with the token from MEMRL_MEMORY_TOKEN (not the config)."""
    fake_llm.responder = answer
    token = "fleet-token-0123456789"
    tokens = json.dumps([{"name": "fleet", "token": token, "namespaces": ["fleet"]}])
    with http_server(tmp_path / "memory", tmp_path, MEMRL_TOKENS=tokens) as server, anyio.fail_after(90):
        config = RunConfig(benchmark="capitals", mode="memrl", epochs=1, seed=3, memory_url=server.url)
        monkeypatch.setenv(ENV_MEMORY_TOKEN, token)
        first = await Runner(config, CapitalsQuiz(), RunDir(tmp_path / "first"), llm).run()
        second = await Runner(config, CapitalsQuiz(), RunDir(tmp_path / "second"), llm).run()
        opening = [next(r for r in run if r.position == 0) for run in (first, second)]
        assert not opening[0].memory_ids  # an empty memory at first
        assert opening[1].memory_ids  # the second run starts with what the first stored
        assert all(r.memory_ids for r in second)
        assert token not in RunDir(tmp_path / "second").config_file.read_text()

        monkeypatch.delenv(ENV_MEMORY_TOKEN)
        with pytest.raises(RunError, match=f"cannot open the memory at .* needs {ENV_MEMORY_TOKEN}"):
            await Runner(config, CapitalsQuiz(), RunDir(tmp_path / "third"), llm).run()


@pytest.mark.anyio
async def test_a_server_without_the_modes_tools_is_named(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path):
    """A --memory-url server on the default tool profile serves memrl's loop, not rag's search_experience: the run
    stops naming the tool and the setting that offers it."""
    fake_llm.responder = answer
    with http_server(tmp_path / "memory", tmp_path, MEMRL_TOOL_PROFILE="core") as server, anyio.fail_after(90):
        learning = RunConfig(benchmark="capitals", mode="memrl", epochs=1, memory_url=server.url)
        assert await Runner(learning, CapitalsQuiz(), RunDir(tmp_path / "memrl"), llm).run()
        lookup = RunConfig(benchmark="capitals", mode="rag", epochs=1, memory_url=server.url)
        with pytest.raises(RunError, match=r"Unknown tool: search_experience .* MEMRL_TOOL_PROFILE=full"):
            await Runner(lookup, CapitalsQuiz(), RunDir(tmp_path / "rag"), llm).run()
