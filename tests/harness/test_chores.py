"""The coding chores (memrl_harness/benchmarks/chores.py): a world fixed by its seed, a stale memory per chore, and a
check that is the chore's own tests really run, whose output the plugin's hooks read as any test run."""

from __future__ import annotations

import random

import pytest

from memrl_harness.benchmarks.base import Memory
from memrl_harness.benchmarks.chores import (
    KINDS,
    ChoresBenchmark,
    failure_experience,
    run_tests,
    success_experience,
)
from memrl_harness.benchmarks.controlled import choose, named_procedure
from memrl_harness.benchmarks.options import OptionError
from memrl_mcp.clients.checks import recognise


def test_the_world_is_fixed_by_its_seed_and_each_kind_has_both_layouts() -> None:
    first, again, other = ChoresBenchmark(), ChoresBenchmark(), ChoresBenchmark(seed=3)
    assert first.tasks() == again.tasks()
    assert [t.data["layout"] for t in first.tasks()] != [t.data["layout"] for t in other.tasks()]
    tasks = first.tasks()
    assert (
        len(tasks) == 12
        and len({t.intent for t in tasks}) == 12
        and {t.type for t in tasks} == {"pin", "rename", "fix"}
    )
    for seed in range(5):  # a sibling's fix is not always this chore's
        layouts = {(t.type, t.data["layout"]) for t in ChoresBenchmark(seed=seed).tasks()}
        assert len(layouts) >= 4, seed
    assert [t.id for t in ChoresBenchmark(subjects="1").tasks()] == ["pin-0", "rename-0", "fix-0"]
    for bad in ({"subjects": 0}, {"subjects": 5}, {"seed": "x"}):
        with pytest.raises(OptionError, match=f"^chores: {next(iter(bad))}: must "):
            ChoresBenchmark(**bad)


def test_every_chore_starts_with_a_stale_success_in_its_memory() -> None:
    bench = ChoresBenchmark()
    seeded = bench.seeded()
    assert [m.task for m in seeded] == [t.intent for t in bench.tasks()]
    assert {m.outcome for m in seeded} == {"success"}
    for memory, task in zip(seeded, bench.tasks(), strict=True):
        kind = next(k for k in KINDS if k.name == task.type)
        assert named_procedure(memory.experience, [p.name for p in kind.procedures]) == kind.stale.name
        assert kind.stale.name not in kind.works_on.values()


def test_the_agent_follows_its_memory_and_without_one_tries() -> None:
    """The controlled benchmark's agent, on a chore's procedures: the stale success followed, a recalled failure of it
    avoided; an experience of another kind's procedure passed over."""
    pin = ChoresBenchmark(subjects=1).tasks()[0]
    stale = Memory("m1", pin.intent, success_experience("edit requirements.txt"), "success", 0.0, 1.0)
    other = Memory("m2", "x", success_experience("keep the offset"), "success", 0.9, 0.9)
    warned = Memory("m3", pin.intent, failure_experience("edit requirements.txt"), "failure", 0.0, 1.0)
    names = [p.name for p in KINDS[0].procedures]
    assert choose([other, stale], names, random.Random(0)).procedure == "edit requirements.txt"
    tries = {choose([warned, stale], names, random.Random(i)).procedure for i in range(40)}
    assert tries == set(names) - {"edit requirements.txt"}


@pytest.mark.slow  # runs each chore's tests with pytest, in processes of their own
def test_one_procedure_works_now_and_the_stale_one_worked_once() -> None:
    """On each kind and layout: the layout's procedure passes the chore's tests and every other fails, the stale one
    among them, which passed the project as it used to be; the output is pytest's, with its summary line, and the
    plugin's hooks read it as a test run with its counts."""
    bench = ChoresBenchmark(seed=1)
    chosen = {(t.type, t.data["layout"]): t for t in reversed(bench.tasks())}
    assert len(chosen) == 6
    for task in chosen.values():
        kind = next(k for k in KINDS if k.name == task.type)
        works = kind.works_on[task.data["layout"]]
        for procedure in kind.procedures:
            run = bench.check(task, procedure.name)
            assert (run.exit_code == 0) == (procedure.name == works), (task.id, procedure.name, run.output)
            found = recognise(run.command, run.output, run.exit_code)
            assert found is not None and found["kind"] == "tests" and found["passed"] == (run.exit_code == 0)
            assert (found.get("failed_count", 0) > 0) == (run.exit_code != 0), found
        assert run_tests(bench.project(task, kind.stale.name, now=False)).exit_code == 0, task.id
        assert run_tests(bench.project(task, now=False)).exit_code == 1, task.id  # the chore was to do then too
        assert run_tests(bench.project(task)).exit_code == 1, task.id


@pytest.mark.slow  # runs the chore's tests with pytest
def test_an_episode_carries_the_real_test_run_and_the_edit() -> None:
    bench = ChoresBenchmark(subjects=1)
    task = bench.tasks()[1]  # rename-0
    stale = Memory("m1", task.intent, success_experience("rename the definition"), "success", 0.0, 1.0)
    episode = bench.run_episode(task, [stale], None, random.Random(0))
    assert not episode.success and episode.reward == -1.0
    assert episode.check is not None and episode.check.exit_code == 1
    assert "failed" in episode.check.output.splitlines()[-1] and "AttributeError" in episode.check.output
    assert episode.edited == ("users.py",)
    assert episode.experience == failure_experience("rename the definition")
    assert episode.mistaken_experience == success_experience("rename the definition")
    assert "followed memory m1: rename the definition" in episode.trajectory
    assert bench.run_episode(task, [stale], None, random.Random(0)) == episode
