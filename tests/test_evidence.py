"""What counts as evidence and how a recall's reward is decided (memrl_mcp/memory/evidence.py), rule by rule."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from memrl_mcp.memory.evidence import decide, verdict
from memrl_mcp.rewards import RewardScale
from memrl_mcp.validation import Check

SCALE = RewardScale(-1.0, 1.0)


def checks(*items: dict[str, Any]) -> list[Check]:
    return [Check(**item) for item in items]


PYTEST_FAILS = {"kind": "tests", "command": "pytest -q", "passed": False, "failed_count": 2, "passed_count": 40}
PYTEST_PASSES = {"kind": "tests", "command": "pytest -q", "passed": True, "passed_count": 42}
EDIT = {"kind": "edit"}


def test_the_latest_run_of_each_command_after_the_last_edit_decides() -> None:
    assert verdict(checks(PYTEST_FAILS)) == verdict(checks(PYTEST_PASSES, EDIT, PYTEST_FAILS))
    assert not verdict(checks(PYTEST_FAILS)).succeeded  # type: ignore[union-attr]
    fixed = verdict(checks(PYTEST_FAILS, EDIT, PYTEST_PASSES))
    assert fixed is not None and (fixed.succeeded, fixed.source) == (True, "tests")
    assert verdict(checks(PYTEST_FAILS, PYTEST_PASSES)).succeeded  # type: ignore[union-attr]  # rerun: it passes now
    assert verdict(checks(PYTEST_PASSES, EDIT)) is None  # what passed tested the code before the edit
    build_fails = {"kind": "build", "command": "cargo build", "passed": False}
    broken = verdict(checks(PYTEST_PASSES, build_fails))
    assert broken is not None and (broken.succeeded, broken.source) == (False, "build")


def test_a_clean_lint_or_type_check_alone_proves_nothing_but_a_failing_one_is_a_failure() -> None:
    lint = {"kind": "lint", "command": "ruff check .", "passed": True}
    assert verdict(checks(lint, {"kind": "typecheck", "command": "mypy", "passed": True})) is None
    assert verdict(checks(PYTEST_PASSES, {**lint, "passed": False})).source == "lint"  # type: ignore[union-attr]


def test_the_users_last_word_wins_over_every_check() -> None:
    said = verdict(checks(PYTEST_PASSES, {"kind": "user", "passed": False, "said": "still broken"}))
    assert said is not None and (said.succeeded, said.source) == (False, "user")
    later = checks({"kind": "user", "passed": False}, PYTEST_FAILS, {"kind": "user", "passed": True})
    assert verdict(later).succeeded  # type: ignore[union-attr]


def test_the_models_claim_decides_only_alone_and_moves_less_and_a_contradiction_is_kept() -> None:
    assert decide([], None, SCALE, 0.5) is None
    alone = decide([], 1.0, SCALE, 0.5)
    assert alone is not None and (alone.reward, alone.source, alone.weight, alone.contradicted) == (
        1.0,
        "agent",
        0.5,
        False,
    )
    overruled = decide(checks(PYTEST_FAILS), 1.0, SCALE, 0.5)
    assert overruled is not None and (overruled.reward, overruled.source, overruled.weight) == (-1.0, "tests", 1.0)
    assert overruled.contradicted and overruled.claimed == 1.0
    agreed = decide(checks(PYTEST_PASSES), 1.0, SCALE, 0.5)
    assert agreed is not None and not agreed.contradicted and agreed.reward == 1.0
    unsure = decide(checks(PYTEST_FAILS), 0.0, SCALE, 0.5)  # "no clear outcome" contradicts nothing
    assert unsure is not None and not unsure.contradicted and unsure.reward == -1.0
    assert decide(checks(PYTEST_PASSES), None, RewardScale(0.0, 10.0), 0.5).reward == 10.0  # type: ignore[union-attr]


def test_a_check_is_refused_by_field() -> None:
    for bad, field in (
        ({"kind": "tests"}, "passed"),
        ({"kind": "edit", "passed": True}, "passed"),
        ({"kind": "deploy", "passed": True}, "kind"),
        ({"kind": "tests", "passed": True, "command": "x" * 201}, "command"),
        ({"kind": "tests", "passed": True, "failed_count": -1}, "failed_count"),
        ({"kind": "tests", "passed": True, "output": "..."}, "output"),
    ):
        with pytest.raises(ValidationError, match=field):
            Check(**bad)
