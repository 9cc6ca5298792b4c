"""Every tool, resource and error through the real MCP client, on both embedded engines."""

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import (
    ForgetRequest,
    ListQuery,
    MemoryEdit,
    NewExperience,
    OutcomeReport,
    RecallQuery,
    StatsQuery,
    StepQuery,
    TrajectoryReport,
)
from memrl_mcp.surface.server import create_server
from memrl_mcp.validation import TrajectoryStep
from tests.support.mcp import call, hints, make_service, prompt_text, read_json, refused
from tests.support.servers import TOOLS

pytestmark = pytest.mark.anyio

MUG = "put a clean mug in the coffee machine"
MUG_PROCEDURE = "1. take the mug from the counter 2. rinse it in the sink 3. put it in the coffee machine"


async def test_lists_tools_with_schemas_and_hints(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    assert hints(tools["memory_stats"]).read_only_hint is True
    assert hints(tools["search_experience"]).read_only_hint is True
    assert hints(tools["forget_experience"]).destructive_hint is True
    assert hints(tools["report_outcome"]).destructive_hint is False
    assert all(tool.output_schema is None for tool in tools.values())  # documented in docs/tools.md instead
    assert "description" in tools["recall_experience"].input_schema["properties"]["task"]
    # The bounds are in the schemas, so clients are told them; unknown arguments are refused.
    recall = tools["recall_experience"].input_schema
    assert recall["additionalProperties"] is False
    assert recall["properties"]["task"]["maxLength"] == 4000
    bounds = {
        name: {key: recall["properties"][name].get(key) for key in ("type", "minimum", "maximum")}
        for name in recall["properties"]
    }
    assert bounds["k1"] == {"type": "integer", "minimum": 1, "maximum": 100}
    assert bounds["q_weight"] == {"type": "number", "minimum": 0.0, "maximum": 1.0}
    assert bounds["delta"] == {"type": "number", "minimum": -1.0, "maximum": 1.0}
    assert "pattern" in recall["properties"]["namespace"]
    report = tools["report_outcome"].input_schema["properties"]
    assert (report["reward"]["minimum"], report["reward"]["maximum"]) == (-1.0, 1.0)
    assert "8 levels deep" in report["metadata"]["description"]


async def test_search_looks_up_without_a_recall(client: Client) -> None:
    stored = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    found = await call(client, "search_experience", task=MUG, q_weight=0.0)
    assert "recall_id" not in found and [m["id"] for m in found["memories"]] == [stored["id"]]
    stats = await call(client, "memory_stats")
    assert stats["recalls_pending"] == 0 and stats["recalls_reported"] == 0


async def test_store_then_recall_returns_the_memory_with_its_numbers(client: Client, service: MemoryService) -> None:
    stored = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE, metadata={"bench": "alf"})
    assert not stored["merged"] and stored["memory"]["q"] == 0.0 and stored["memory"]["visits"] == 0

    recall = await call(client, "recall_experience", task="rinse a mug and put it into the coffee machine")
    assert recall["candidates"] == 1 and not recall["explored"]
    (memory,) = recall["memories"]
    assert memory["id"] == stored["id"] and memory["experience"] == MUG_PROCEDURE
    assert "metadata" not in memory and not memory["shortened"]  # what the agent needs to act; the rest is a read away
    whole = await read_json(client, f"memrl://memories/{memory['id']}")
    assert whole["metadata"] == {"bench": "alf"}
    assert 0.5 < memory["similarity"] < 1.0
    # One candidate: z(Q) = 0, so the score is half its corpus z(sim).
    expected = 0.5 * (memory["similarity"] - service.scale.z_similarity.mean) / service.scale.z_similarity.std
    assert memory["score"] == pytest.approx(expected, abs=1e-6)
    stats = await call(client, "memory_stats")
    assert stats["recalls_pending"] == 1 and stats["recalls_reported"] == 0


async def test_nothing_similar_is_a_valid_empty_answer(client: Client) -> None:
    await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    recall = await call(client, "recall_experience", task="compute the md5 checksum of every file in /etc")
    assert recall["memories"] == [] and recall["candidates"] == 0


async def test_report_updates_exactly_the_recalled_memories_once(client: Client) -> None:
    first = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    second = await call(client, "store_experience", task="heat a mug of milk", experience="use the microwave")
    other = await call(client, "store_experience", task="list the files of /tmp", experience="ls -la /tmp")
    recall = await call(client, "recall_experience", task="put a mug in the coffee machine", k2=2)
    recalled = [m["id"] for m in recall["memories"]]
    assert set(recalled) == {first["id"], second["id"]}

    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    assert [(c["id"], c["q_before"], c["visits"]) for c in report["updated"]] == [(i, 0.0, 1) for i in recalled]
    assert all(c["q_after"] == pytest.approx(0.3) for c in report["updated"])
    assert report["stored"] is None and report["missing"] == []

    again = await refused(client, "report_outcome", recall_id=recall["recall_id"], reward=-1.0)
    assert "recall_id" in again and "already reported" in again
    unchanged = await read_json(client, f"memrl://memories/{other['id']}")
    assert unchanged["q"] == 0.0 and unchanged["visits"] == 0
    updated = await read_json(client, f"memrl://memories/{first['id']}")
    assert updated["q"] == pytest.approx(0.3) and updated["visits"] == 1 and updated["last_reward"] == 1.0


async def test_report_stores_the_new_experience_under_the_recalled_task(client: Client) -> None:
    recall = await call(client, "recall_experience", task=MUG)
    assert recall["memories"] == []
    report = await call(
        client, "report_outcome", recall_id=recall["recall_id"], reward=-1.0, experience="forgot to rinse the mug"
    )
    stored = report["stored"]["memory"]
    assert stored["task"] == MUG and stored["outcome"] == "failure" and stored["q"] == 0.0
    found = await call(client, "recall_experience", task=MUG)
    assert [m["id"] for m in found["memories"]] == [report["stored"]["id"]]
    assert found["memories"][0]["similarity"] == pytest.approx(1.0, abs=1e-5)


async def test_a_reported_experience_merges_into_its_identical_twin_and_a_new_one_earns_its_own_utility(
    client: Client,
) -> None:
    """The merge rule: the same procedure written again (case and spacing aside) merges into its twin, which keeps
    the utility it learned; a different procedure for the same task is a memory of its own, starting from Q_init:
    it must not inherit what another earned. Outcomes stay apart."""
    first = await call(client, "store_experience", task=MUG, experience="Rinse the mug,  then brew.")
    recall = await call(client, "recall_experience", task=MUG + ".")
    same = await call(
        client, "report_outcome", recall_id=recall["recall_id"], reward=1.0, experience="rinse the mug, then brew."
    )
    assert same["stored"]["merged"] and same["stored"]["id"] == first["id"]
    assert same["stored"]["memory"]["q"] == pytest.approx(0.3)  # the learned Q stays, updated
    recall = await call(client, "recall_experience", task=MUG)
    other = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0, experience="use a pod")
    assert not other["stored"]["merged"] and other["stored"]["memory"]["q"] == 0.0  # its own, untried
    recall = await call(client, "recall_experience", task=MUG)
    failure = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=-1.0, experience="slipped")
    assert not failure["stored"]["merged"] and failure["stored"]["memory"]["outcome"] == "failure"
    assert (await call(client, "memory_stats"))["memories"] == 3


async def test_a_tasks_variants_are_bounded_the_weakest_giving_way(client: Client) -> None:
    """Near-duplicate tasks with the same text merge, whatever their spelling; different texts are variants, at most
    max_task_variants (3) per task and outcome: a fourth replaces the one of lowest utility."""
    first = await call(client, "store_experience", task=MUG, experience="procedure A")
    twin = await call(client, "store_experience", task=" " + MUG.capitalize(), experience="Procedure  a")
    assert twin["merged"] and twin["id"] == first["id"] and twin["memory"]["merges"] == 1
    weak = await call(
        client, "store_experience", task="  Put a clean  mug in the coffee machine. ", experience="B", q=-0.4
    )
    strong = await call(client, "store_experience", task=MUG, experience="procedure C", q=0.6)
    assert not weak["merged"] and not strong["merged"]
    fourth = await call(client, "store_experience", task=MUG, experience="procedure D")
    listed = {m["experience"] for m in (await call(client, "list_memories"))["memories"]}
    assert listed == {"Procedure  a", "procedure C", "procedure D"} and not fourth["merged"]  # B (q -0.4) gave way
    failure = await call(client, "store_experience", task=MUG, experience="dropped it", outcome="failure", q=-0.5)
    assert not failure["merged"] and failure["memory"]["q"] == -0.5
    stats = await call(client, "memory_stats")
    assert (stats["memories"], stats["successes"], stats["failures"]) == (4, 3, 1)


async def test_namespaces_are_isolated(client: Client) -> None:
    await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE, namespace="alice")
    assert (await call(client, "recall_experience", task=MUG, namespace="bob"))["memories"] == []
    assert len((await call(client, "recall_experience", task=MUG, namespace="alice"))["memories"]) == 1
    assert (await call(client, "memory_stats", namespace="bob"))["memories"] == 0


async def test_forget(client: Client) -> None:
    keep = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE, namespace="keep")
    gone = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE, namespace="drop")
    await call(client, "store_experience", task="heat milk", experience="microwave", namespace="drop")
    assert (await call(client, "forget_experience", memory_id=gone["id"]))["deleted"] == 1
    assert "no memory" in await refused(client, "forget_experience", memory_id=gone["id"])
    assert (await call(client, "forget_experience", namespace="drop"))["deleted"] == 1
    assert "exactly one" in await refused(client, "forget_experience")
    assert "exactly one" in await refused(client, "forget_experience", memory_id=keep["id"], namespace="keep")
    stats = await call(client, "memory_stats")
    assert stats["memories"] == 1


async def test_report_skips_a_forgotten_memory(client: Client) -> None:
    stored = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    recall = await call(client, "recall_experience", task=MUG)
    await call(client, "forget_experience", memory_id=stored["id"])
    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    assert report["updated"] == [] and report["missing"] == [stored["id"]]


async def test_stats_resources_and_prompt(client: Client) -> None:
    for q in (-1.0, 0.0, 0.5, 1.0):
        await call(client, "store_experience", task=f"task number {q}", experience="x", q=q, namespace="s")
    stats = await call(client, "memory_stats", namespace="s")
    assert stats["q"] == {"min": -1.0, "p25": -0.25, "median": 0.25, "p75": 0.625, "max": 1.0, "mean": 0.125}
    everything = await read_json(client, "memrl://stats")
    assert everything["memories"] == 4 and everything["namespace"] is None
    one = await read_json(client, "memrl://stats/s")
    assert one == stats
    with pytest.raises(Exception, match="no memory"):
        await client.read_resource("memrl://memories/3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11")
    prompt = await client.get_prompt("memory_loop", {"task": "make tea"})
    text = prompt_text(prompt)
    assert "make tea" in text and "recall_experience" in text and "report_outcome" in text


BAD_REQUESTS = [
    ("recall_experience", {"task": ""}, "task"),
    ("recall_experience", {"task": "   "}, "task"),
    ("recall_experience", {"task": "\x00\x00"}, "visible"),
    ("recall_experience", {"task": "\ufeff\u200b\u200d\u2060"}, "visible"),
    ("recall_experience", {"task": " \t\n\u3000\u00a0"}, "visible"),
    ("recall_experience", {"task": "\ud800 lone surrogate"}, "task"),
    ("recall_experience", {"task": MUG, "k1": True}, "k1"),
    ("recall_experience", {"task": MUG, "k1": "5"}, "k1"),
    ("recall_experience", {"task": MUG, "k1": 2.0}, "k1"),
    ("recall_experience", {"task": MUG, "q_weight": "0.5"}, "q_weight"),
    ("recall_experience", {"task": MUG, "tsak": "typo"}, "tsak"),
    ("search_experience", {"task": MUG, "k2": 0}, "k2"),
    ("store_experience", {"task": MUG, "experience": "e", "q": True}, "q"),
    ("store_experience", {"task": MUG, "experience": "e", "q": "0.5"}, "q"),
    ("store_experience", {"task": MUG, "experience": "e", "namespce": "x"}, "namespce"),
    ("store_experience", {"task": MUG, "experience": "\u200b"}, "experience"),
    ("store_experience", {"task": MUG, "experience": "e", "metadata": [1, 2]}, "metadata"),
    ("report_outcome", {"recall_id": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", "reward": "0.5"}, "reward"),
    ("report_outcome", {"recall_id": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", "reward": 1, "rewrd": 1}, "rewrd"),
    ("forget_experience", {"namespace": "x", "everything": True}, "everything"),
    ("memory_stats", {"namespace": 5}, "namespace"),
    ("recall_experience", {"task": "x" * 4001}, "4000"),
    ("recall_experience", {"task": MUG, "k1": 0}, "k1"),
    ("recall_experience", {"task": MUG, "k1": 101}, "k1"),
    ("recall_experience", {"task": MUG, "k1": 3, "k2": 4}, "k2"),
    ("recall_experience", {"task": MUG, "q_weight": 1.5}, "q_weight"),
    ("recall_experience", {"task": MUG, "delta": 2.0}, "delta"),
    ("recall_experience", {"task": MUG, "namespace": "a b"}, "namespace"),
    ("store_experience", {"task": MUG, "experience": ""}, "experience"),
    ("store_experience", {"task": MUG, "experience": "e" * 20001}, "20000"),
    ("store_experience", {"task": MUG, "experience": "e", "q": 3.0}, "q"),
    ("store_experience", {"task": MUG, "experience": "e", "outcome": "maybe"}, "outcome"),
    ("store_experience", {"task": MUG, "experience": "e", "metadata": {"x": "y" * 5000}}, "metadata"),
    ("report_outcome", {"recall_id": "not-a-recall", "reward": 1.0}, "recall_id"),
    ("report_outcome", {"recall_id": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", "reward": 1.0}, "unknown recall"),
    ("memory_stats", {"namespace": "/etc/passwd"}, "namespace"),
]


@pytest.mark.parametrize(("tool", "arguments", "named"), BAD_REQUESTS)
async def test_bad_input_is_refused_by_name_and_changes_nothing(
    client: Client, tool: str, arguments: dict[str, Any], named: str
) -> None:
    await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    before = await call(client, "memory_stats")
    message = await refused(client, tool, **arguments)
    assert named in message
    # In plain words: no pydantic report (its model's name, error types, a link to its documentation).
    for jargon in ("validation error", "Arguments", "[type=", "input_value", "https://", "pydantic"):
        assert jargon not in message, message
    assert await call(client, "memory_stats") == before


@pytest.mark.parametrize("reward", [1.5, -2.0, "NaN", "Infinity"])
async def test_bad_reward_leaves_the_recall_reportable(client: Client, reward: Any) -> None:
    await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    recall = await call(client, "recall_experience", task=MUG)
    message = await refused(client, "report_outcome", recall_id=recall["recall_id"], reward=reward)
    assert "reward" in message
    bad_experience = await refused(
        client, "report_outcome", recall_id=recall["recall_id"], reward=1.0, experience="e" * 20001
    )
    assert "experience" in bad_experience
    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    assert report["updated"][0]["q_before"] == 0.0 and report["updated"][0]["visits"] == 1


def test_non_finite_rewards_are_refused_by_the_service(service: MemoryService) -> None:
    recall = service.recall(RecallQuery(MUG), access=EVERYTHING)
    for reward in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(MemoryRequestError, match="reward: Input should be a finite number"):
            service.report(OutcomeReport(recall.recall_id, reward), access=EVERYTHING)
    for wrong in ("0.5", True):  # the Python API is as strict as the tools
        with pytest.raises(MemoryRequestError, match="reward: Input should be a valid number"):
            service.report(OutcomeReport(recall.recall_id, wrong), access=EVERYTHING)  # type: ignore[arg-type]
    assert service.report(OutcomeReport(recall.recall_id, 0.5), access=EVERYTHING).reward == 0.5


def test_every_caller_facing_method_requires_the_callers_access(service: MemoryService) -> None:
    """Fail-closed tenancy: a new tool that forgets to pass its caller's access gets a TypeError, never every
    tenant's memories."""
    calls = {
        "recall": RecallQuery(MUG),
        "search": RecallQuery(MUG),
        "report": OutcomeReport("3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", 1.0),
        "store_experience": NewExperience(MUG, MUG_PROCEDURE),
        "recall_step_advice": StepQuery(MUG, "You are in the kitchen."),
        "report_trajectory": TrajectoryReport(MUG, [TrajectoryStep(observation="o", action="a", reward=1.0)], "e"),
        "forget": ForgetRequest(namespace="default"),
        "get": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11",
        "stats": StatsQuery(),
        "list_memories": ListQuery(),
        "update_memory": MemoryEdit("3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", reset_q=True),
    }
    for name, request in calls.items():
        with pytest.raises(TypeError, match="access"):
            getattr(service, name)(request)


async def test_an_expired_recall_is_refused(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path, recall_ttl_seconds=0.05)
    try:
        async with Client(create_server(service)) as client:
            recall = await call(client, "recall_experience", task=MUG)
            time.sleep(0.1)
            assert "expired" in await refused(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    finally:
        service.close()


async def test_concurrent_reports_lose_no_update(client: Client) -> None:
    stored = await call(client, "store_experience", task=MUG, experience=MUG_PROCEDURE)
    rewards = [1.0, -1.0, 0.5, 0.0, 1.0, -0.5, 1.0, -1.0] * 4
    recalls = [await call(client, "recall_experience", task=MUG) for _ in rewards]
    changes: list[dict[str, Any]] = []

    async def report(recall_id: str, reward: float) -> None:
        result = await call(client, "report_outcome", recall_id=recall_id, reward=reward)
        changes.append({"reward": reward, **result["updated"][0]})

    async with anyio.create_task_group() as group:
        for recall, reward in zip(recalls, rewards, strict=True):
            group.start_soon(report, recall["recall_id"], reward)

    # The reports were applied one after another: each started from the Q the previous one left.
    chain = sorted(changes, key=lambda c: c["visits"])
    assert [c["visits"] for c in chain] == list(range(1, len(rewards) + 1))
    q = 0.0
    for change in chain:
        assert change["q_before"] == pytest.approx(q)
        q = q + 0.3 * (change["reward"] - q)
        assert change["q_after"] == pytest.approx(q)
    final = await read_json(client, f"memrl://memories/{stored['id']}")
    assert final["visits"] == len(rewards) and final["q"] == pytest.approx(q)
