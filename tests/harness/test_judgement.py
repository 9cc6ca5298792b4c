"""The agent's judgement of its own work (memrl_harness/judgement.py) and the evidence option: the claims as drawn, the
options' checks, and tiny runs of each through `memrl-harness`: what episodes.jsonl and run.json keep of them, and the
report's figures."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from memrl_harness.cli import main
from memrl_harness.judgement import Judgement, claims_success
from memrl_harness.results import RunConfig, RunDir
from tests.harness.test_cli import harness


def test_each_judgement_claims_what_it_should() -> None:
    truth = [random.Random(f"truth {i}").random() < 0.3 for i in range(4000)]

    def claims(judgement: Judgement) -> list[bool]:
        return [claims_success(judgement, t, random.Random(f"claim {i}")) for i, t in enumerate(truth)]

    assert claims("honest") == truth
    wrong = sum(c != t for c, t in zip(claims("noisy"), truth, strict=True)) / len(truth)
    assert 0.085 < wrong < 0.115
    flattering = claims("sycophantic")
    for happened in (True, False):  # success nine times in ten, whatever happened
        said = [c for c, t in zip(flattering, truth, strict=True) if t == happened]
        assert 0.87 < sum(said) / len(said) < 0.93, happened
    assert claims("noisy") == claims("noisy")  # drawn from the episode's own seed


def test_the_options_say_which_agent_and_which_runs_they_belong_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"benchmark": "chores", "epochs": 1}
    for bad, message in (
        ({"mode": "rag", "judgement": "noisy"}, "judgement, evidence: mode memrl reports a reward the agent claims"),
        ({"mode": "none", "evidence": "hooks"}, "judgement, evidence: mode memrl"),
        ({"mode": "memrl", "judgement": "noisy", "user_rewards": 0.1}, "the simulated user gives the rewards"),
        ({"mode": "memrl", "evidence": "hooks", "discipline": "forgetful"}, "evidence hooks: the agent reports when"),
        ({"mode": "memrl", "evidence": "hooks", "memory_url": "http://127.0.0.1:1/mcp"}, "no memory_url"),
        ({"mode": "memrl", "discipline": "hooked", "client_model": True}, "no client_model"),
    ):
        with pytest.raises(ValidationError, match=message):
            RunConfig(**base, **bad)
    config = RunConfig(**base, mode="memrl", judgement="sycophantic", evidence="hooks")
    assert config.uses_plugin and config.mode_label == "memrl, sycophantic agent, evidence from the hooks"
    runs = str(tmp_path / "runs")
    assert main(["run", "chores", "--mode", "none", "memrl", "--judgement", "noisy", "--runs", runs]) == 2
    assert "--judgement, --evidence: only --mode memrl" in capsys.readouterr().err
    assert not Path(runs).exists()


@pytest.mark.slow  # runs the harness end to end: memrl-mcp servers, the plugin's hook processes
def test_tiny_runs_of_every_agent_keep_the_claim_and_the_rewards_source(tmp_path: Path) -> None:
    runs, small = tmp_path / "runs", ["--option", "families=2", "--option", "tasks_per_family=2", "--epochs", "2"]
    done = harness(
        "run", "controlled", "--mode", "memrl", "--judgement", "honest", "sycophantic", "--evidence", "none", "hooks",
        "--runs", str(runs), *small, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = sorted(path.name for path in runs.iterdir())
    assert names == sorted(
        f"controlled-memrl{agent}-seed0"
        for agent in ("", "-evidence-hooks", "-sycophantic", "-sycophantic-evidence-hooks")
    )
    episodes = {name: RunDir(runs / name).episodes() for name in names}
    for name, records in episodes.items():
        config = RunDir(runs / name).read_config()
        assert len(records) == 8 and (config.judgement, config.evidence) == (
            "sycophantic" if "sycophantic" in name else "honest",
            "hooks" if "hooks" in name else "none",
        )
        if config.evidence == "hooks":  # the checker's verdict, as a test run the hooks saw, decided every reward
            assert {(r.reward_source, r.recall_by, r.report_by) for r in records} == {("tests", "hook", "stop hook")}
            assert all(r.learned_reward == r.checker_reward for r in records)
        else:  # the claim alone
            assert {(r.reward_source, r.recall_by, r.report_by) for r in records} == {("agent", "agent", "agent")}
            assert all(r.learned_reward == r.claimed_reward for r in records)
    honest, flatterer = episodes["controlled-memrl-seed0"], episodes["controlled-memrl-sycophantic-seed0"]
    assert all(r.claimed_reward == r.checker_reward for r in honest)
    assert any(r.claimed_reward != r.checker_reward for r in flatterer)
    # The same draws with the hooks or without: the first episode, before the memories differ, claims the same.
    assert (
        episodes["controlled-memrl-sycophantic-evidence-hooks-seed0"][0].claimed_reward == flatterer[0].claimed_reward
    )

    report = harness("report", *map(str, sorted(runs.iterdir())), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "last third's success" in text and "claims overruled" in text
    assert "memrl, sycophantic agent, evidence from the hooks" in text and "tests 8" in text
    summary = json.loads((runs / "controlled-memrl-sycophantic-evidence-hooks-seed0" / "summary.json").read_text())
    assert summary["reward_sources"] == {"tests": 8} and summary["claims_overruled"] > 0
