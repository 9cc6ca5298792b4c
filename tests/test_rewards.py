"""Rewards from what happened (issue 39), through the real MCP client and server: the evidence decides a recall's
reward whatever the agent claims, the user's word wins, the agent's own word moves utility less, a report credits the
memories the agent followed, later evidence corrects a reward just given, and no clear outcome stores no failure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.surface.observability import Metrics
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, make_service, read_json, refused, text_of

TASK = "fix the failing date parser test"
STALE = "patch parse_date to strip the timezone: the tests pass"
FRESH = "parse with fromisoformat and keep the offset"
FAILED = {"kind": "tests", "command": "pytest -q tests/test_dates.py", "passed": False, "failed_count": 1}
PASSED = {"kind": "tests", "command": "pytest -q tests/test_dates.py", "passed": True, "passed_count": 12}
ALPHA = 0.3
pytestmark = pytest.mark.anyio


@pytest.fixture
async def product(embedder: Embedder, tmp_path: Path) -> AsyncIterator[tuple[MemoryService, Client]]:
    """A server with the product's defaults of learning (model_reward_weight 0.5), every tool offered."""
    service = make_service(embedder, tmp_path / "data", model_reward_weight=0.5)
    try:
        async with Client(create_server(service)) as client:
            yield service, client
    finally:
        service.close()


async def recalled(client: Client, *experiences: str) -> dict[str, Any]:
    for index, experience in enumerate(experiences):
        await call(client, "store_experience", task=f"{TASK} (variant {index})", experience=experience)
    return await call(client, "recall_experience", task=TASK)


async def test_a_claim_of_success_cannot_raise_the_utility_of_what_failed_its_tests(
    product: tuple[MemoryService, Client],
) -> None:
    """The sycophant: tests failed after the last edit, the agent reports success anyway. The reward is the
    tests' (-1), the claim is kept beside it and counted, the stale memory's utility falls, and the experience the
    agent wrote as a success is kept as a failure."""
    service, client = product
    recall = await recalled(client, STALE)
    edit = {"kind": "edit"}
    held = await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[PASSED, edit, FAILED])
    assert (held["checks"], held["evidence_says"], held["evidence_source"]) == (3, "failure", "tests")
    state = await read_json(client, f"memrl://recalls/{recall['recall_id']}")
    assert state["evidence_says"] == "failure" and len(state["evidence"]) == 3
    report = await client.call_tool(
        "report_outcome", {"recall_id": recall["recall_id"], "reward": 1.0, "experience": "1. strip the timezone"}
    )
    result = report.structured_content
    assert result is not None
    assert (result["reward"], result["reward_source"], result["claimed"]) == (-1.0, "tests", 1.0)
    (change,) = result["updated"]
    assert change["q_before"] == 0.0 and change["q_after"] == pytest.approx(ALPHA * -1.0)  # by alpha: the tests said
    assert result["stored"]["memory"]["outcome"] == "failure"
    assert "decided by tests; the reward 1 given was not taken" in text_of(report)
    assert service.contradicted == 1 and service.rewards["tests"] == 1
    exposition = Metrics(service).exposition().decode()  # what /metrics serves
    assert "memrl_reports_contradicted_total 1.0" in exposition
    assert 'memrl_rewards_total{source="tests"} 1.0' in exposition
    (event,) = (await read_json(client, f"memrl://memories/{change['id']}"))["history"]
    assert (event["source"], event["claimed"], event["reward"]) == ("tests", 1.0, -1.0)


async def test_the_agents_word_alone_moves_utility_by_half_and_a_passing_run_by_alpha(
    product: tuple[MemoryService, Client],
) -> None:
    _, client = product
    first = await recalled(client, STALE)
    report = await call(client, "report_outcome", recall_id=first["recall_id"], reward=1.0)
    assert report["reward_source"] == "agent" and report["claimed"] is None
    assert report["updated"][0]["q_after"] == pytest.approx(ALPHA * 0.5)
    second = await call(client, "recall_experience", task=TASK)
    await call(client, "record_evidence", recall_id=second["recall_id"], checks=[PASSED])
    agreed = await call(client, "report_outcome", recall_id=second["recall_id"], reward=1.0)
    assert agreed["reward_source"] == "tests" and agreed["claimed"] is None  # it agreed: nothing contradicted
    q = ALPHA * 0.5
    assert agreed["updated"][0]["q_after"] == pytest.approx(q + ALPHA * (1.0 - q))


async def test_close_reports_with_the_evidence_and_a_report_without_reward_asks_nobody_when_it_speaks(
    product: tuple[MemoryService, Client],
) -> None:
    _, client = product
    recall = await recalled(client, STALE)
    quiet = await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[{"kind": "edit"}], close=True)
    assert quiet["report"] is None and quiet["evidence_says"] is None  # nothing clear: stays open
    closed = await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[PASSED], close=True)
    assert (closed["report"]["reward"], closed["report"]["reward_source"]) == (1.0, "tests")
    assert (await read_json(client, f"memrl://recalls/{recall['recall_id']}"))["status"] == "reported"
    other = await call(client, "recall_experience", task=TASK)
    await call(client, "record_evidence", recall_id=other["recall_id"], checks=[FAILED])
    # No reward, and this client offers no elicitation: the evidence decides, so nobody needs to be asked.
    report = await call(client, "report_outcome", recall_id=other["recall_id"], experience="do not strip it")
    assert (report["reward"], report["reward_source"]) == (-1.0, "tests")


async def test_close_with_nothing_new_reports_with_the_evidence_handed_in_before(
    product: tuple[MemoryService, Client],
) -> None:
    """The hooks hand a turn's checks in at its stop, then close the recall when its task is over (a new task, the
    session's end) with nothing new: the close reports with what was handed in (it was refused, "at least 1 item")."""
    _, client = product
    recall = await recalled(client, STALE)
    await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[FAILED])
    closed = await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[], close=True)
    assert (closed["report"]["reward"], closed["report"]["reward_source"]) == (-1.0, "tests")


async def test_the_users_next_words_correct_a_reward_just_given_as_if_it_had_been_theirs(
    product: tuple[MemoryService, Client],
) -> None:
    """The agent reported success; the user's next prompt says it is still broken: within the correction window
    the recalled memory's utility becomes what a failure would have made it, once, with the event in its history;
    a second identical word changes nothing."""
    _, client = product
    recall = await recalled(client, STALE)
    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    (change,) = report["updated"]
    user = {"kind": "user", "passed": False, "said": "it is still broken"}
    corrected = await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[user])
    assert (corrected["report"]["reward"], corrected["report"]["reward_source"]) == (-1.0, "user")
    (fixed,) = corrected["report"]["updated"]
    assert fixed["q_after"] == pytest.approx(ALPHA * (-1.0 - 0.0))  # as if the user's -1 had been reported
    assert fixed["q_before"] == pytest.approx(change["q_after"])
    again = await call(client, "record_evidence", recall_id=recall["recall_id"], checks=[user])
    assert again["report"] is None  # the same decision: no second correction
    memory = await read_json(client, f"memrl://memories/{change['id']}")
    assert [e["event"] for e in memory["history"]] == ["reward", "correction"]
    assert memory["q"] == pytest.approx(-ALPHA)
    state = await read_json(client, f"memrl://recalls/{recall['recall_id']}")
    assert (state["reward"], state["reward_source"]) == (-1.0, "user")


async def test_a_correction_is_refused_once_the_window_is_past(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path / "data", correction_window_seconds=0.0)
    try:
        async with Client(create_server(service)) as client:
            recall = await recalled(client, STALE)
            await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
            message = await refused(
                client, "record_evidence", recall_id=recall["recall_id"], checks=[{"kind": "user", "passed": False}]
            )
            assert "correction_window_seconds=0" in message and "settled" in message
    finally:
        service.close()


async def test_only_the_memories_the_agent_followed_move(product: tuple[MemoryService, Client]) -> None:
    """A stale memory shown beside the one followed gains nothing from the success it had no part in."""
    _, client = product
    recall = await recalled(client, STALE, FRESH)
    assert len(recall["memories"]) == 2
    for position in (0, 3):  # refused whole, before anything moves
        message = await refused(
            client, "report_outcome", recall_id=recall["recall_id"], reward=1.0, followed=[position]
        )
        assert "followed" in message
    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0, followed=[2])
    assert [c["id"] for c in report["updated"]] == [recall["memories"][1]["id"]]


async def test_no_clear_outcome_stores_no_failure(product: tuple[MemoryService, Client]) -> None:
    _, client = product
    recall = await recalled(client, STALE)
    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=0.0, experience="it depends")
    assert report["stored"] is None and "no clear outcome" in report["message"]
    listed = await call(client, "list_memories")
    assert [m["experience"] for m in listed["memories"]] == [STALE]
