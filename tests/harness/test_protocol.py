"""The paper's protocol beyond runtime learning, through the real runner and a real memrl-mcp over stdio:
the transfer setting on a frozen (read-only) memory, the memp and reflexion baselines, and the trajectories and
final memory every run keeps."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from memrl_harness.benchmarks import memory_config
from memrl_harness.benchmarks.base import Task
from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.llm import LLM
from memrl_harness.metrics import TaskSimilarity, mean_pairwise_similarity
from memrl_harness.results import Attempt, RunConfig, RunDir, TrajectoryRecord, TransferConfig, bound
from memrl_harness.runner import RunError, Runner, frozen_memory_client, split_tasks
from memrl_mcp.embeddings import Embedder
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.harness.quiz import CAPITALS, MISSED, CapitalsQuiz

# runs the harness end to end, with memrl-mcp servers: `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow

SMALL = {"families": "2", "tasks_per_family": "8"}  # 16 tasks, one appliance's twin families


def config(mode: str, epochs: int = 2, **extra: object) -> RunConfig:
    return RunConfig(
        benchmark="controlled",
        mode=mode,
        epochs=epochs,
        seed=1,
        memory_config=str(memory_config("controlled")),
        benchmark_options=SMALL,
        **extra,
    )


def export(run_dir: RunDir) -> bytes:
    """The memory as `memrl-mcp export` writes it (memories, Q, visits, merges, times)."""
    args = ["--data-dir", str(run_dir.memory_dir), "--config", str(memory_config("controlled")), "export"]
    done = subprocess.run([sys.executable, "-m", "memrl_mcp.cli", *args], capture_output=True, check=True, timeout=120)
    return done.stdout


def memories(exported: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in exported.splitlines()]


def test_split_tasks_is_deterministic_by_id() -> None:
    tasks = [Task(f"task-{i}", f"do thing {i}") for i in range(400)]
    train, held = split_tasks(tasks, 0.25)
    shuffled = list(tasks)
    random.Random(5).shuffle(shuffled)
    train_again, held_again = split_tasks(shuffled, 0.25)
    assert {t.id for t in train} == {t.id for t in train_again} and {t.id for t in held} == {t.id for t in held_again}
    assert {t.id for t in train} | {t.id for t in held} == {t.id for t in tasks}
    assert not {t.id for t in train} & {t.id for t in held}
    assert 70 <= len(held) <= 130  # a quarter of 400, give or take the hash
    # Growing the list moves no task across the split.
    _, held_more = split_tasks([*tasks, *(Task(f"new-{i}", "x") for i in range(50))], 0.25)
    assert {t.id for t in held} <= {t.id for t in held_more}


@pytest.mark.anyio
async def test_transfer_evaluates_held_out_paraphrases_on_the_memory_training_built(tmp_path: Path) -> None:
    transfer = TransferConfig(eval_options={"paraphrase": "true"}, held_out=0.25)
    run_config = config("memrl", transfer=transfer)
    run_dir = RunDir(tmp_path / "run")
    paraphrased = ControlledBenchmark(**SMALL, paraphrase="true")
    runner = Runner(run_config, ControlledBenchmark(**SMALL), run_dir, None, paraphrased)
    with anyio.fail_after(180):
        training = await runner.run()

    evaluation = run_dir.transfer.episodes()
    _, held = split_tasks(paraphrased.tasks(), 0.25)
    assert held and sorted(r.task_id for r in evaluation) == sorted(t.id for t in held)
    assert not {r.task_id for r in training} & {r.task_id for r in evaluation}
    assert {r.epoch for r in evaluation} == {1}
    # Recall only: the evaluation was given the training's memories and stored nothing.
    assert all(r.memory_ids and r.stored_id is None for r in evaluation)
    trained_ids = {m["id"] for m in memories(run_dir.memory_export.read_bytes())}
    assert {m for r in evaluation for m in r.memory_ids} <= trained_ids
    # The held-out tasks were asked in other words than any training task.
    trajectories = run_dir.transfer.trajectories()
    intents = {t.id: t.intent for t in paraphrased.tasks()}
    assert {t.task_id: t.intent for t in trajectories} == {r.task_id: intents[r.task_id] for r in evaluation}
    assert not {t.intent for t in trajectories} & {t.intent for t in ControlledBenchmark(**SMALL).tasks()}
    assert all(t.experience is None and t.stored_id is None for t in trajectories)
    # The memory is byte for byte what training left (exported after training, again after the evaluation).
    assert export(run_dir) == run_dir.memory_export.read_bytes()
    assert "tool call" in run_dir.transfer.server_log.read_text()  # the evaluation's own server logged there

    # Resuming a finished transfer runs nothing again.
    with anyio.fail_after(120):
        await Runner(run_config, ControlledBenchmark(**SMALL), run_dir, None, paraphrased).run()
    assert len(run_dir.transfer.episodes()) == len(evaluation)


@pytest.mark.anyio
async def test_the_frozen_memory_refuses_every_write(tmp_path: Path) -> None:
    """The evaluation's server, not the runner's good manners, keeps the memory frozen: an evaluation that tries to
    store, report, or forget is refused by memrl-mcp started with MEMRL_TOOL_PROFILE=read_only, and nothing changes."""
    run_config = config("memrl", epochs=1, transfer=TransferConfig(held_out=0.25))
    run_dir = RunDir(tmp_path / "run")
    with anyio.fail_after(120):
        await Runner(run_config, ControlledBenchmark(**SMALL), run_dir, None).run()
    before = export(run_dir)
    victim = memories(before)[0]
    with anyio.fail_after(120):
        async with frozen_memory_client(run_config, run_dir) as client:
            # Every memory the store holds is a candidate (several share the victim's task text).
            wide = {"k1": 100, "k2": 100, "delta": -1.0}
            found = await client.call_tool("search_experience", {"task": str(victim["task"]), **wide})
            assert not found.is_error and found.structured_content is not None
            assert victim["id"] in [m["id"] for m in found.structured_content["memories"]]  # look-ups work
            attempts: dict[str, dict[str, Any]] = {
                "recall_experience": {"task": str(victim["task"])},  # logs a recall: a write too
                "store_experience": {"task": "a new task", "experience": "a new lesson", "outcome": "success"},
                "report_outcome": {"recall_id": "a-recall-made-elsewhere", "reward": 1.0},
                "forget_experience": {"memory_id": str(victim["id"])},
            }
            refused = {}
            for tool, arguments in attempts.items():
                result = await client.call_tool(tool, arguments)
                refused[tool] = result.is_error
    assert refused == dict.fromkeys(attempts, True), "memrl-mcp with MEMRL_TOOL_PROFILE=read_only accepted a write"
    assert export(run_dir) == before


@pytest.mark.anyio
async def test_memp_stores_successes_only_and_recalls_by_similarity(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    with anyio.fail_after(180):
        records = await Runner(config("memp", epochs=3), ControlledBenchmark(**SMALL), run_dir, None).run()
    assert any(not r.success for r in records) and any(r.success for r in records)
    assert all((r.stored_id is not None) == r.success for r in records)
    stored = memories(run_dir.memory_export.read_bytes())
    assert stored and {m["outcome"] for m in stored} == {"success"}
    assert all(m["q"] == 0.0 and m["visits"] == 0 for m in stored)  # no Q update, ever
    for trajectory in run_dir.trajectories():
        given = trajectory.attempts[0].memories
        similarities = [m.similarity for m in given if m.similarity is not None]
        assert len(similarities) == len(given)
        assert similarities == sorted(similarities, reverse=True)  # lambda 0: ranked by similarity alone
        assert all(m.outcome == "success" for m in given)


@pytest.mark.anyio
async def test_each_episode_keeps_what_it_saw_and_what_it_stored(tmp_path: Path, embedder: Embedder) -> None:
    run_dir = RunDir(tmp_path / "run")
    with anyio.fail_after(180):
        records = await Runner(config("memrl", epochs=2), ControlledBenchmark(**SMALL), run_dir, None).run()
    assert run_dir.trajectories_file.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    trajectories = {(t.epoch, t.task_id): t for t in run_dir.trajectories()}
    assert len(trajectories) == len(records) == 2 * 16
    final = {m["id"]: m for m in memories(run_dir.memory_export.read_bytes())}
    for record in records:
        trajectory = trajectories[(record.epoch, record.task_id)]
        (attempt,) = trajectory.attempts
        assert [m.id for m in attempt.memories] == record.memory_ids
        assert all(m.q is not None and m.similarity is not None and m.score is not None for m in attempt.memories)
        assert (trajectory.checker_reward, trajectory.success, trajectory.stored_id) == (
            record.checker_reward,
            record.success,
            record.stored_id,
        )
        assert "checker: " in attempt.trajectory and trajectory.experience
        assert record.stored_id in final  # merges keep ids: every stored experience is in the final memory
    # The newest experience of each memory is the text its last episode stored.
    last_stored = {t.stored_id: t.experience for t in sorted(trajectories.values(), key=lambda t: t.epoch)}
    assert all(final[memory_id]["experience"] == text for memory_id, text in last_stored.items())
    # In epoch 2 the memories given carry the Q the first epoch taught.
    assert any(m.q != 0.0 for t in trajectories.values() if t.epoch == 2 for m in t.attempts[0].memories)
    # The tasks' intra-dataset similarity, with the run's embedder (MiniLM, as the packaged settings say).
    similarity = TaskSimilarity.model_validate_json(run_dir.similarity_file.read_text())
    intents = [t.intent for t in ControlledBenchmark(**SMALL).tasks()]
    assert similarity.tasks == 16 and similarity.embedder == embedder.name
    assert similarity.mean_pairwise == pytest.approx(mean_pairwise_similarity(embedder.embed(intents)), abs=1e-6)


def test_trajectories_are_bounded_and_survive_a_torn_write(tmp_path: Path) -> None:
    long = "".join(f"step {i}: looked around\n" for i in range(10_000))
    kept = bound(long, 2_000)
    assert len(kept) == 2_000 and kept.startswith("step 0:") and kept.endswith("looked around\n")
    assert "characters cut" in kept and bound("short", 2_000) == "short"
    run = RunDir(tmp_path / "run")
    for epoch in (1, 2, 3):
        attempt = Attempt(memories=[], trajectory=bound(long), success=True, checker_reward=1.0, steps=3)
        run.append_trajectory(
            TrajectoryRecord(epoch=epoch, task_id="t", intent="i", attempts=[attempt], checker_reward=1.0, success=True)
        )
    assert len(gzip.decompress(run.trajectories_file.read_bytes()).splitlines()) == 3
    assert run.trajectories_file.stat().st_size < 3 * 20_000 / 5  # repetitive text compresses
    data = run.trajectories_file.read_bytes()
    run.trajectories_file.write_bytes(data[:-10])  # a kill in the middle of the last member
    assert [t.epoch for t in run.trajectories()] == [1, 2]
    run.drop_torn_tail()  # as a resume does, so that what it appends is readable
    run.append_trajectory(
        TrajectoryRecord(epoch=3, task_id="t", intent="i", attempts=[], checker_reward=0.0, success=False)
    )
    assert [t.epoch for t in run.trajectories()] == [1, 2, 3]


def reflective(request: RecordedRequest) -> str:
    """Wrong on Spain unless a reflection of an earlier attempt is in the prompt; writes reflections."""
    text = request.last_user
    if text.startswith("Past experience:"):
        country = text.rsplit("of ", 1)[1].rstrip("?")
        if country == MISSED and "[failure] Barcelona is not the capital" not in text:
            return "Barcelona"
        return CAPITALS[country]
    return "Barcelona is not the capital of Spain; Madrid is"


@pytest.mark.anyio
async def test_reflexion_retries_a_failed_task_with_its_reflection_and_forgets_it_after(
    fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path
):
    fake_llm.responder = reflective
    run_dir = RunDir(tmp_path / "run")
    run_config = RunConfig(benchmark="capitals", mode="reflexion", epochs=2, seed=3, trials=3)
    with anyio.fail_after(90):
        records = await Runner(run_config, CapitalsQuiz(), run_dir, llm).run()
    assert all(r.success for r in records)
    # Spain needs a second attempt in every epoch: no memory across tasks or epochs.
    assert {(r.epoch, r.task_id): r.trials for r in records} == {
        (e, f"capital-{c}"): 2 if c == MISSED else 1 for e in (1, 2) for c in CAPITALS
    }
    assert not run_dir.memory_dir.exists() and not run_dir.memory_export.exists()
    spain = [t for t in run_dir.trajectories() if t.task_id == f"capital-{MISSED}"]
    for trajectory in spain:
        first, second = trajectory.attempts
        assert not first.success and first.memories == [] and first.reflection
        assert second.success and [m.id for m in second.memories] == ["reflection-1"]
        assert "answered: Madrid" in second.trajectory
    # Tokens of all attempts and the reflection are counted; an answer and a reflection per retry.
    asked = [r.last_user.startswith("Past experience:") for r in fake_llm.chat_requests]
    assert asked.count(True) == 2 * (len(CAPITALS) + 1) and asked.count(False) == 2


def test_reflexion_options_are_checked() -> None:
    with pytest.raises(ValueError, match="trials: only reflexion"):
        RunConfig(benchmark="capitals", mode="memrl", epochs=1, trials=2)
    with pytest.raises(ValueError, match="less than or equal to 10"):
        RunConfig(benchmark="capitals", mode="reflexion", epochs=1, trials=11)
    assert RunConfig(benchmark="capitals", mode="reflexion", epochs=1).attempts == 3
    with pytest.raises(ValueError, match="eval_options or held_out"):
        TransferConfig()
    with pytest.raises(ValueError, match="cannot use memory_url"):
        RunConfig(benchmark="c", mode="memrl", epochs=1, memory_url="http://x", transfer=TransferConfig(held_out=0.5))
    with pytest.raises(RunError, match="needs the benchmark built with them"):
        Runner(
            config("memrl", transfer=TransferConfig(eval_options={"paraphrase": "true"})),
            ControlledBenchmark(**SMALL),
            RunDir(Path("/nonexistent")),
            None,
        )
