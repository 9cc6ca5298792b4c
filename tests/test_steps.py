"""The step memory (Rememberer) through the real MCP client and server, on both embedded engines: advice,
trajectory reports applied once per episode_id, hostile inputs, tenants, crashes and backups."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client

from tests.conftest import call

pytestmark = pytest.mark.anyio

MUG = "put a clean mug in the coffee machine"
ROOM = "You are in the middle of a room. Looking around you, you see a countertop 1, a sinkbasin 1, a coffeemachine 1."
COUNTER = "On the countertop 1, you see a mug 1 and a knife 1."
HOLDING = "You pick up the mug 1 from the countertop 1."
KNIFE = "You pick up the knife 1 from the countertop 1."


def trajectory(*steps: tuple[str, str, float]) -> list[dict[str, Any]]:
    return [{"observation": o, "action": a, "reward": r} for o, a, r in steps]


SUCCESS = trajectory(
    (ROOM, "go to countertop 1", 0.0),
    (COUNTER, "take mug 1 from countertop 1", 0.0),
    (HOLDING, "go to sinkbasin 1", 1.0),
)
FAILURE = trajectory(
    (ROOM, "go to countertop 1", 0.0),
    (COUNTER, "take knife 1 from countertop 1", 0.0),
    (KNIFE, "go to coffeemachine 1", -1.0),
)


def advised(advice: dict[str, Any], kind: str) -> list[tuple[str, float, int]]:
    return [(a["action"], a["q"], a["visits"]) for a in advice[kind]]


async def test_reports_change_the_advice(client: Client) -> None:
    """Defaults: n = 1, gamma = 1, Q the running mean of its targets. Hand-computed:
    e-1 (success): Q(ROOM, go) = 0 + nothing known of COUNTER yet = 0; Q(COUNTER, mug) = 0; Q(HOLDING, sink) = 1.
    e-2 (failure): Q(ROOM, go) = mean(0, 0 + max Q(COUNTER) = 0) = 0; Q(COUNTER, knife) = 0; Q(KNIFE, coffee) = -1.
    e-3 (success): Q(COUNTER, mug) = mean(0, 0 + max Q(HOLDING) = 1) = 0.5: the reward flowed back one step."""
    empty = await call(client, "recall_step_advice", task=MUG, observation=COUNTER)
    assert empty["encouraged"] == [] and empty["discouraged"] == [] and empty["records"] == []

    first = await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e-1")
    assert (first["already_applied"], first["steps"], first["updated"], first["created"]) == (False, 3, 3, 3)
    assert [(c["target"], c["q_before"], c["q_after"]) for c in first["changes"]] == [
        (0.0, None, 0.0),
        (0.0, None, 0.0),
        (1.0, None, 1.0),
    ]
    second = await call(client, "report_trajectory", task=MUG, steps=FAILURE, episode_id="e-2")
    assert (second["updated"], second["created"], second["merged"]) == (3, 1, 1)  # (ROOM, go) merged
    third = await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e-3")
    assert (third["updated"], third["created"], third["merged"]) == (3, 0, 3)
    assert [(c["target"], c["q_after"], c["visits"]) for c in third["changes"]] == [
        (0.0, 0.0, 3),
        (1.0, 0.5, 2),
        (1.0, 1.0, 2),
    ]

    advice = await call(client, "recall_step_advice", task=MUG, observation=COUNTER, k=1)
    (record,) = advice["records"]
    assert record["observation"] == COUNTER and record["task"] == MUG
    for key in ("similarity", "task_similarity", "observation_similarity"):
        assert record[key] == pytest.approx(1.0, abs=1e-5)
    assert advised(advice, "encouraged") == [("take mug 1 from countertop 1", 0.5, 2)]
    assert advised(advice, "discouraged") == [("take knife 1 from countertop 1", 0.0, 1)]
    assert advice["advice_threshold"] == 0.0
    after_knife = await call(client, "recall_step_advice", task=MUG, observation=KNIFE, k=1)
    assert advised(after_knife, "discouraged") == [("go to coffeemachine 1", -1.0, 1)]
