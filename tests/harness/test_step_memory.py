"""The step-memory modes (rememberer, both) of the multi-step benchmarks, through the runner and a real memrl-mcp
over stdio: each decision's prompt carries the step memory's advice, each episode's trajectory is reported, and the
one-decision benchmarks refuse the modes. The fake LLM (tests/harness/fake_llm.py) plays ALFWorld, LLB DB and OS."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks import REGISTRY
from memrl_harness.benchmarks.alfworld import AlfworldBenchmark
from memrl_harness.benchmarks.base import (
    ActionAdvice,
    StepAdvice,
    Steps,
    StepwiseBenchmark,
    with_advice,
)
from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.benchmarks.llb_db import LLBDBBenchmark
from memrl_harness.benchmarks.llb_os import LLBOSBenchmark
from memrl_harness.llm import LLM
from memrl_harness.results import EpisodeRecord, RunConfig, RunDir
from memrl_harness.runner import RunError, Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.support.benchmark_data import benchmark_data

pytestmark = pytest.mark.slow  # needs MariaDB and the sandbox: `make test` runs it, `make test-fast` does not

ADVICE = "Advice from earlier episodes at a similar point"
PENCIL = "pick_and_place_simple-Pencil-None-Desk-310/trial_T20190909_113054_894334"


def test_advice_reads_as_encouraged_and_discouraged_actions() -> None:
    advice = StepAdvice(
        encouraged=(ActionAdvice("take mug 1 from countertop 1", 0.75, 4),),
        discouraged=(ActionAdvice("go to fridge 1", -1.0, 2),),
    )
    text = advice.section()
    assert text.startswith(ADVICE)
    assert "Encouraged actions" in text and "- take mug 1 from countertop 1 (value +0.75, tried 4x)" in text
    assert "Discouraged actions" in text and "- go to fridge 1 (value -1.00, tried 2x)" in text
    assert not StepAdvice() and StepAdvice().section() == ""
    # The advice goes to the call's last message only; the kept history is untouched.
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "observation"}]
    chat = with_advice(history, advice)
    assert chat[-1]["content"] == f"observation\n\n{text}" and history[-1]["content"] == "observation"
    assert with_advice(history, StepAdvice()) == history
    steps = Steps(lambda observation: advice if observation == "known" else StepAdvice())
    assert steps.advise("known") == advice and not steps.advise("new") and steps.advised == 1


def test_only_multi_step_benchmarks_take_step_memory() -> None:
    stepwise = {}
    for name, entry in REGISTRY.items():
        module, cls = entry.target.split(":")
        stepwise[name] = issubclass(getattr(importlib.import_module(module), cls), StepwiseBenchmark)
    assert stepwise == {
        "controlled": False,
        "chores": False,
        "controlled-steps": True,
        "bigcodebench": False,
        "hle": False,
        "alfworld": True,
        "llb-db": True,
        "llb-os": True,
    }


@pytest.mark.parametrize("mode", ["rememberer", "both"])
def test_one_step_benchmarks_refuse_the_step_modes(tmp_path: Path, mode: str) -> None:
    config = RunConfig(benchmark="controlled", mode=mode, epochs=1)
    with pytest.raises(RunError, match=f"mode {mode}: benchmark controlled takes one decision per task"):
        Runner(config, ControlledBenchmark(), RunDir(tmp_path / "run"), None)
    assert not (tmp_path / "run").exists()


def check_reported(records: list[EpisodeRecord]) -> None:
    """Every episode reported all its steps; the first epoch had no advice, the second did."""
    assert records and all(r.reported_steps == r.steps > 0 for r in records)
    assert [r.advised_steps for r in records if r.epoch == 1] == [0]
    assert all(r.advised_steps > 0 for r in records if r.epoch == 2)


@pytest.mark.anyio
async def test_alfworld_rememberer_advises_each_step(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path) -> None:
    source = benchmark_data("alfworld", "valid_seen", PENCIL)  # a small bedroom: fast to reset
    shutil.copytree(source, tmp_path / "games" / PENCIL)
    bench = AlfworldBenchmark(games=tmp_path / "games", max_steps=3)
    (task,) = bench.tasks()
    fake_llm.responder = json.dumps({"thought": "let me look", "action": "look"})
    config = RunConfig(benchmark="alfworld", mode="rememberer", epochs=2, seed=0)
    run_dir = RunDir(tmp_path / "run")
    with anyio.fail_after(120):
        records = await Runner(config, bench, run_dir, llm).run()
    check_reported(records)
    prompts = [r.last_user for r in fake_llm.chat_requests]
    assert len(prompts) == 6 and all(f"Your task is to: {task.intent}" in p for p in prompts)
    assert not any(ADVICE in p for p in prompts[:3])
    # Read back from the step memory: looking never won, so it is discouraged, tried in the first episode.
    assert all("Discouraged actions (they led to failure; avoid them):\n- look (value" in p for p in prompts[3:])
    assert all(p.index(ADVICE) < p.index("Admissible commands") for p in prompts[3:])


@pytest.mark.anyio
async def test_llb_db_both_memories(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path) -> None:
    bench = LLBDBBenchmark(ids="254")  # a SELECT task
    (task,) = bench.tasks()
    gold = task.data["answer_info"]["sql"]

    def answer(request: RecordedRequest) -> str:
        if request.response_format is None:  # the runner's experience summary
            return "1. run the SQL 2. answer with its rows"
        if len(request.messages) == 2:
            return json.dumps({"thought": "run the SQL", "action": "sql", "content": gold})
        rows = request.messages[-1]["content"].split("rows: ", 1)[1].split("\n\n")[0]  # the advice follows
        return json.dumps({"thought": "that is it", "action": "answer", "content": rows})

    fake_llm.responder = answer
    config = RunConfig(benchmark="llb-db", mode="both", epochs=2, seed=0)
    run_dir = RunDir(tmp_path / "run")
    try:
        with anyio.fail_after(120):
            records = await Runner(config, bench, run_dir, llm).run()
    finally:
        bench.close()
    check_reported(records)
    assert all(r.success for r in records) and all(r.recall_id and r.stored_id for r in records)
    episodes = [r for r in fake_llm.chat_requests if r.response_format is not None]
    assert len(episodes) == 4  # 2 epochs x (SQL, answer)
    first, second = episodes[2].last_user, episodes[3].last_user
    assert "Experiences that worked on similar tasks" in first  # the episode memory
    assert ADVICE in first and f"- sql: {gold} (value" in first  # the step memory, on the table's description
    assert ADVICE in second and "- answer: " in second
    # The advice of an earlier round is not kept in the chat history.
    assert sum(ADVICE in m["content"] for m in episodes[3].messages) == 1


@pytest.mark.anyio
async def test_llb_os_rememberer(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path) -> None:
    bench = LLBOSBenchmark(ids="0", max_rounds=3)
    (task,) = bench.tasks()
    script = bench.script(task, "ground_truth")

    def answer(request: RecordedRequest) -> str:
        played = sum(m["role"] == "assistant" for m in request.messages)
        if played == 0:
            return json.dumps({"thought": "do it", "action": "bash", "content": script})
        return json.dumps({"thought": "done", "action": "finish", "content": ""})

    fake_llm.responder = answer
    config = RunConfig(benchmark="llb-os", mode="rememberer", epochs=2, seed=0)
    run_dir = RunDir(tmp_path / "run")
    with anyio.fail_after(120):
        records = await Runner(config, bench, run_dir, llm).run()
    check_reported(records)
    assert all(r.success and r.recall_id is None and not r.memory_ids for r in records)
    requests = fake_llm.chat_requests
    assert len(requests) == 4 and not any(ADVICE in r.last_user for r in requests[:2])
    assert ADVICE in requests[2].last_user and f"- bash: {script}" in requests[2].last_user
    assert "- finish: " in requests[3].last_user
