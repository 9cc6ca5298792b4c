"""The agent's discipline (memrl_harness/discipline.py): a forgetful agent's lapses as drawn, and, through the runner
and a real memrl-mcp, what the memory learns from each agent: the forgetful one folds fewer rewards into Q; with the
Claude Code plugin's real hooks (memrl_harness/plugin.py), the same forgetful agent teaches the memory exactly what the
disciplined one does."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from memrl_harness.benchmarks import memory_config
from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.cli import main
from memrl_harness.discipline import lapse
from memrl_harness.results import EpisodeRecord, RunConfig, RunDir
from memrl_harness.runner import Runner

SMALL = {"families": "2", "tasks_per_family": "4"}  # 8 tasks: one appliance's twin families


def test_a_forgetful_agent_lapses_in_its_share_of_tasks_half_recalls_half_reports() -> None:
    draws = Counter(lapse("forgetful", 0.6, random.Random(f"draw {i}")) for i in range(4000))
    assert 0.57 < 1 - draws[None] / 4000 < 0.63
    assert abs(draws["recall"] - draws["report"]) < 0.1 * (draws["recall"] + draws["report"])
    assert {lapse("disciplined", 1.0, random.Random(i)) for i in range(100)} == {None}
    assert {lapse("forgetful", 0.0, random.Random(i)) for i in range(100)} == {None}
    assert None not in {lapse("hooked", 1.0, random.Random(i)) for i in range(100)}


def test_only_memrl_has_a_discipline_to_lose_and_only_a_forgetful_agent_a_lapse_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValidationError, match="discipline forgetful: mode memrl recalls and reports, not mode rag"):
        RunConfig(benchmark="controlled", mode="rag", epochs=1, discipline="forgetful")
    with pytest.raises(ValidationError, match="lapse_rate: only a forgetful or hooked agent"):
        RunConfig(benchmark="controlled", mode="memrl", epochs=1, lapse_rate=0.5)
    assert RunConfig(benchmark="controlled", mode="memrl", epochs=1, discipline="hooked").lapse_rate == 0.6
    runs = str(tmp_path / "runs")
    assert main(["run", "controlled", "--mode", "rag", "--discipline", "forgetful", "--runs", runs]) == 2
    assert "--discipline: only --mode memrl recalls and reports" in capsys.readouterr().err
    assert main(["run", "controlled", "--lapse-rate", "0.3", "--runs", runs]) == 2
    assert "--lapse-rate: only a forgetful or hooked agent" in capsys.readouterr().err
    assert not Path(runs).exists()


def learned(run_dir: RunDir) -> list[tuple[str, str, str, float, int]]:
    """The final memory as the server exported it: each memory's task, experience, outcome, Q and visits (the
    rewards folded into it)."""
    memories = [json.loads(line) for line in run_dir.memory_export.read_text().splitlines()]
    return sorted((m["task"], m["experience"], m["outcome"], m["q"], m["visits"]) for m in memories)


def lapses(records: list[EpisodeRecord], recall_by: str | None, report_by: str | None) -> set[tuple[int, str]]:
    return {(r.epoch, r.task_id) for r in records if (r.recall_by, r.report_by) == (recall_by, report_by)}


@pytest.mark.slow  # runs the harness end to end, with memrl-mcp servers and the plugin's hook processes
@pytest.mark.anyio
async def test_the_hooks_give_a_forgetful_agent_the_disciplined_ones_learning(tmp_path: Path) -> None:
    runs: dict[str, RunDir] = {}

    async def one(discipline: str) -> None:
        config = RunConfig(
            benchmark="controlled",
            mode="memrl",
            epochs=3,
            seed=2,
            memory_config=str(memory_config("controlled")),
            benchmark_options=SMALL,
            discipline=discipline,
        )
        runs[discipline] = RunDir(tmp_path / discipline)
        await Runner(config, ControlledBenchmark(**SMALL), runs[discipline], None).run()

    with anyio.fail_after(300):
        async with anyio.create_task_group() as group:
            for discipline in ("disciplined", "forgetful", "hooked"):
                group.start_soon(one, discipline)
    records = {discipline: run_dir.episodes() for discipline, run_dir in runs.items()}
    memory = {discipline: learned(run_dir) for discipline, run_dir in runs.items()}
    folded = {discipline: sum(m[-1] for m in memories) for discipline, memories in memory.items()}
    for discipline, episodes in records.items():  # the records say what the server counted
        assert sum(r.q_updates for r in episodes) == folded[discipline], discipline

    disciplined, forgetful, hooked = records["disciplined"], records["forgetful"], records["hooked"]
    assert lapses(disciplined, "agent", "agent") == {(r.epoch, r.task_id) for r in disciplined}
    # The forgetful agent acted without memory, or left its recall pending, in some tasks: fewer Q updates.
    skipped, unreported = lapses(forgetful, None, None), lapses(forgetful, "agent", None)
    assert skipped and unreported
    assert all(
        not r.memory_ids and r.learned_reward is None and r.stored_id is None for r in forgetful if not r.recall_by
    )
    assert folded["forgetful"] < folded["disciplined"]
    assert len(memory["forgetful"]) < len(memory["disciplined"])
    # With the hooks the same agent (the same lapses) recalled every time through UserPromptSubmit, and the Stop hook
    # had it report exactly the recalls it left unreported; a prompt that found no memory is reported by the agent
    # too, since the hook's context names the recall found or not (issue 40.6): the memory learned what the
    # disciplined agent's did.
    assert {r.recall_by for r in hooked} == {"hook"}
    unseen = {(r.epoch, r.task_id) for r in hooked if not r.memory_ids}
    assert unseen and unseen != {(r.epoch, r.task_id) for r in hooked}
    assert lapses(hooked, "hook", "stop hook") == unreported
    assert lapses(hooked, "hook", "agent") == lapses(forgetful, "agent", "agent") | skipped
    assert memory["hooked"] == memory["disciplined"]
    assert [(r.epoch, r.task_id, r.success, r.learned_reward, r.q_updates) for r in hooked] == [
        (r.epoch, r.task_id, r.success, r.learned_reward, r.q_updates) for r in disciplined
    ]
