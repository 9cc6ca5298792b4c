"""The harness as memrl-mcp's MCP client answering the server (memrl_harness/client_help.py), through the runner and
a real memrl-mcp over stdio: a simulated user who gives the rewards and is sometimes wrong (elicitation), and the
run's LLM writing the experiences from trajectories (sampling)."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.llm import LLM
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import RunError, Runner
from tests.harness.fake_llm import FakeLLMServer

pytestmark = pytest.mark.anyio

USER_ERROR = 0.1
EPOCHS = 5
SEEDS = (0, 1)


async def run(tmp_path: Path, mode: str, seed: int, llm: LLM | None = None, **config: object) -> RunDir:
    run_dir = RunDir(tmp_path / f"{mode}-{seed}")
    options = {"benchmark": "controlled", "mode": mode, "epochs": EPOCHS, "seed": seed} | config
    await Runner(RunConfig.model_validate(options), ControlledBenchmark(), run_dir, llm).run()
    return run_dir


def last_epoch(run_dir: RunDir) -> float:
    records = run_dir.episodes()
    last = max(r.epoch for r in records)
    return statistics.mean(r.success for r in records if r.epoch == last)


@pytest.mark.slow  # runs the harness end to end, with memrl-mcp servers
async def test_with_a_user_who_is_wrong_one_time_in_ten_memrl_still_leads(tmp_path: Path) -> None:
    """memrl's rewards and outcomes come from the simulated user (memrl-mcp asks it); rag learns no reward, and labels
    what it stores with what the user says in the chat (the same user, asked by the agent). Last epoch, mean of two
    seeds: memrl > rag > none (measured: docs/harness.md, "Rewards from a user")."""
    runs: dict[str, list[RunDir]] = {}

    async def one(mode: str, seed: int) -> None:
        runs.setdefault(mode, []).append(await run(tmp_path, mode, seed, user_rewards=USER_ERROR))

    with anyio.fail_after(300):
        async with anyio.create_task_group() as group:
            for mode in ("none", "rag", "memrl"):
                for seed in SEEDS:
                    group.start_soon(one, mode, seed)
    success = {mode: statistics.mean(last_epoch(d) for d in dirs) for mode, dirs in runs.items()}
    assert success["memrl"] > success["rag"] > success["none"], success
    for mode in ("memrl", "rag"):
        episodes = [r for d in runs[mode] for r in d.episodes()]
        wrong = sum(r.user_said_success != r.success for r in episodes)
        assert all(r.user_said_success is not None for r in episodes) and 0 < wrong < 0.2 * len(episodes), (mode, wrong)
        # The memory learned the user's reward (memrl-mcp's answer to it: reward_max / reward_min), which the record
        # keeps apart from the checker's; rag folds no reward into Q.
        learned = [r.learned_reward for r in episodes]
        if mode == "memrl":
            assert learned == [1.0 if r.user_said_success else -1.0 for r in episodes]
            assert sum(r.learned_reward != r.checker_reward for r in episodes) == wrong
        else:
            assert learned == [None] * len(episodes)
        # What each learned from the user's answers: the outcome of the memories it stored is what the user said.
        said = {r.stored_id: r.user_said_success for r in episodes}
        for line in (runs[mode][0].path / "memory.jsonl").read_text().splitlines():
            memory = json.loads(line)
            if memory["id"] in said and memory["merges"] == 0:
                assert memory["outcome"] == ("success" if said[memory["id"]] else "failure"), (mode, memory)


@pytest.mark.slow
async def test_the_runs_llm_writes_the_experiences_the_server_asks_for(tmp_path: Path) -> None:
    """--client-model: the reports hand over the trajectory; memrl-mcp asks the client's model (sampling), which is
    the run's LLM (here the fake OpenAI-compatible server); the experiences are stored and recalled."""
    with FakeLLMServer(responder=lambda request: "1. Read the request. 2. Apply the named procedure.") as fake:
        llm = LLM(fake.base_url, fake.model, "k", timeout=10.0)
        try:
            run_dir = await run(tmp_path, "memrl", 0, llm, tasks=8, epochs=2, client_model=True)
        finally:
            llm.close()
        requests = fake.chat_requests
    assert len(requests) == 16  # one experience per episode: 8 tasks, 2 epochs
    system, user = requests[0].messages
    assert "<<<EPISODE" in system["content"] and "never follow instructions" in system["content"]
    assert "What the agent did:" in user["content"]
    memories = [json.loads(line) for line in (run_dir.path / "memory.jsonl").read_text().splitlines()]
    assert memories and {m["experience_source"] for m in memories} == {"client_model"}
    assert {m["experience"] for m in memories} == {"1. Read the request. 2. Apply the named procedure."}
    recalled = [r for r in run_dir.episodes() if r.epoch == 2]
    assert all(r.memory_ids for r in recalled)  # each task of epoch 2 was given its epoch-1 experience
    with gzip.open(run_dir.path / "trajectories.jsonl.gz", "rt") as lines:
        assert {json.loads(line)["experience"] for line in lines} == {m["experience"] for m in memories}


def test_the_client_model_needs_an_llm(tmp_path: Path) -> None:
    config = RunConfig(benchmark="controlled", mode="memrl", epochs=1, client_model=True)
    with pytest.raises(RunError, match="--client-model: the client's model is the run's LLM"):
        Runner(config, ControlledBenchmark(), RunDir(tmp_path), None)
