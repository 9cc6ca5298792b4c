"""list_memories and update_memory, and the Q history, through the real MCP client on both embedded engines;
tenants over the real HTTP server with tokens."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import QEvent
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, hints, make_service, read_json, refused
from tests.support.scripts import run
from tests.support.servers import ALICE, BOB, DEADLINE_S, http_server, mcp_client, tokens_file

pytestmark = pytest.mark.anyio

MUG = "put a clean mug in the coffee machine"
TASKS = [
    "",
    "water the fern on the balcony",
    "compress the log folder into a tarball",
    "",
    "count the lines of every python file",
    "find the largest table of the sales database",
    "",
    "heat an egg in the microwave",
    "list the users who logged in yesterday",
    "",
    "rename every jpeg to lower case",
    "slice an apple with the knife",
    "",
]


async def read_memory(client: Client, memory_id: str) -> dict[str, Any]:
    return await read_json(client, f"memrl://memories/{memory_id}")


async def every_page(client: Client, **arguments: Any) -> tuple[list[dict[str, Any]], int]:
    """All pages of a listing; the memories in order and how many pages it took."""
    memories, cursor, pages = [], None, 0
    while True:
        page = await call(client, "list_memories", **arguments, **({"cursor": cursor} if cursor else {}))
        memories += page["memories"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            return memories, pages


async def test_pages_sort_and_filter(client: Client) -> None:
    # Many ties (the usual case: new memories share Q_init and 0 visits), and a namespace beside it.
    qs = [0.5, 0.0, -0.5, 0.0, 1.0, 0.0, -1.0, 0.5, 0.0, 0.25, 0.0, -0.25, 0.0]
    stored = []
    for i, q in enumerate(qs):
        outcome = "failure" if q < 0 else "success"
        task = f"rinse the Mug and put it on shelf {i}" if i % 3 == 0 else TASKS[i]
        stored.append(await call(client, "store_experience", task=task, experience=f"step {i}", q=q, outcome=outcome))
    await call(client, "store_experience", task="elsewhere", experience="x", namespace="other")
    ids = {s["id"] for s in stored}
    assert len(ids) == len(qs)

    memories, pages = await every_page(client, sort="q", limit=4)
    assert pages == 4 and len(memories) == len(qs) and {m["id"] for m in memories} == ids  # no repeat, no gap
    keys = [(-m["q"], uuid.UUID(m["id"]).int) for m in memories]
    assert keys == sorted(keys)  # Q descending, ties in id order
    ascending, _ = await every_page(client, sort="q", descending=False, limit=5)
    assert [m["q"] for m in ascending] == sorted(qs)
    by_update, _ = await every_page(client, limit=3)
    assert [m["id"] for m in by_update] == [s["id"] for s in reversed(stored)]  # newest first by default
    # One per page: every page ends on a timestamp that qdrant-edge may read back one ulp off its index's.
    singles, pages = await every_page(client, limit=1)
    assert pages == len(qs) and [m["id"] for m in singles] == [s["id"] for s in reversed(stored)]

    by_visits, pages = await every_page(client, sort="visits", limit=5)  # one tie group: 0 visits each
    assert pages == 3 and [m["id"] for m in by_visits] == sorted(ids, key=lambda i: uuid.UUID(i).int)
    first = await call(client, "list_memories", sort="visits", limit=2)
    assert first["total"] == len(qs) and first["namespace"] == "default" and len(first["memories"]) == 2

    failures = await call(client, "list_memories", outcome="failure", limit=100)
    assert sorted(m["q"] for m in failures["memories"]) == [-1.0, -0.5, -0.25] and failures["total"] == 3
    middle = await call(client, "list_memories", q_min=0.0, q_max=0.5, limit=100)
    assert middle["total"] == sum(1 for q in qs if 0.0 <= q <= 0.5)
    # Full text: every word, any case, in the task or the experience; whole words only.
    mugs = await call(client, "list_memories", text="MUG rinse", limit=100)
    assert mugs["total"] == 5 and all("Mug" in m["task"] for m in mugs["memories"])
    assert (await call(client, "list_memories", text="step 4", limit=100))["total"] == 1
    assert (await call(client, "list_memories", text="mu", limit=100))["total"] == 0
    mug_pages, pages = await every_page(client, text="mug", sort="q", limit=2)
    assert len(mug_pages) == 5 and pages == 3
    assert (await call(client, "list_memories", namespace="other"))["total"] == 1

    # Refusals name the field.
    cursor = first["next_cursor"]
    assert "cursor" in await refused(client, "list_memories", sort="q", cursor=cursor)
    assert "cursor" in await refused(client, "list_memories", cursor="bm90IGEgY3Vyc29y")
    assert "limit" in await refused(client, "list_memories", limit=101)
    assert "text" in await refused(client, "list_memories", text="?!")
    assert "q_min" in await refused(client, "list_memories", q_min=0.5, q_max=0.0)
    assert "sort" in await refused(client, "list_memories", sort="task")
    assert "q_max" in await refused(client, "list_memories", q_max=2.0)


async def test_update_edits_text_keeps_what_was_learned_and_resets_only_on_request(client: Client) -> None:
    stored = await call(client, "store_experience", task=MUG, experience="old", metadata={"v": 1})
    recall = await call(client, "recall_experience", task=MUG)
    await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    learned = await read_memory(client, stored["id"])
    assert (learned["q"], learned["visits"]) == (pytest.approx(0.3), 1)
    (event,) = learned["history"]
    assert event["event"] == "reward" and event["recall_id"] == recall["recall_id"]
    assert (event["reward"], event["q_before"], event["q_after"]) == (1.0, 0.0, pytest.approx(0.3))

    edited = await call(client, "update_memory", memory_id=stored["id"], experience="new", metadata={"v": 2})
    assert (edited["experience"], edited["metadata"], edited["task"]) == ("new", {"v": 2}, MUG)
    assert (edited["q"], edited["visits"], edited["last_reward"]) == (pytest.approx(0.3), 1, 1.0)
    assert edited["updated_at"] >= learned["updated_at"] and len(edited["history"]) == 1

    reset = await call(client, "update_memory", memory_id=stored["id"], reset_q=True)
    assert (reset["q"], reset["visits"], reset["last_reward"], reset["experience"]) == (0.0, 0, None, "new")
    assert [e["event"] for e in reset["history"]] == ["reward", "reset"]
    assert reset["history"][1]["q_before"] == pytest.approx(0.3) and reset["history"][1]["q_after"] == 0.0
    assert (await read_memory(client, stored["id"])) == reset

    # The rules of store_experience; nothing is changed by a refused edit.
    assert "nothing to change" in await refused(client, "update_memory", memory_id=stored["id"])
    assert "experience" in await refused(client, "update_memory", memory_id=stored["id"], experience="x" * 20001)
    assert "experience" in await refused(client, "update_memory", memory_id=stored["id"], experience="\u200b")
    deep: dict[str, Any] = {}
    for _ in range(9):
        deep = {"d": deep}
    assert "metadata" in await refused(client, "update_memory", memory_id=stored["id"], metadata=deep)
    assert "reset_q" in await refused(client, "update_memory", memory_id=stored["id"], reset_q="yes")
    assert "q" in await refused(client, "update_memory", memory_id=stored["id"], q=1.0)  # Q is not edited
    unknown = str(uuid.uuid4())
    assert "no memory" in await refused(client, "update_memory", memory_id=unknown, experience="x")
    assert (await read_memory(client, stored["id"])) == reset


async def test_the_history_keeps_the_last_changes(embedder: Embedder, tmp_path: Path, engine: str) -> None:
    service = make_service(embedder, tmp_path / "data", engine, q_history_size=3)
    try:
        async with Client(create_server(service)) as client:
            stored = await call(client, "store_experience", task=MUG, experience="x")
            recalls = []
            for reward in (1.0, -1.0, 1.0, 0.5, -0.5):
                recall = await call(client, "recall_experience", task=MUG)
                await call(client, "report_outcome", recall_id=recall["recall_id"], reward=reward)
                recalls.append(recall["recall_id"])
            memory = await read_memory(client, stored["id"])
    finally:
        service.close()
    assert memory["visits"] == 5
    assert [e["recall_id"] for e in memory["history"]] == recalls[2:]
    assert [e["reward"] for e in memory["history"]] == [1.0, 0.5, -0.5]
    assert memory["history"][-1]["q_after"] == pytest.approx(memory["q"])
    chain = [(a["q_after"], b["q_before"]) for a, b in zip(memory["history"], memory["history"][1:], strict=False)]
    assert all(after == pytest.approx(before) for after, before in chain)


def is_chain(history: list[dict[str, Any]]) -> bool:
    """Each event starts from the Q the one before it ended with."""
    return all(b["q_before"] == pytest.approx(a["q_after"]) for a, b in itertools.pairwise(history))


async def test_a_history_longer_than_the_tail_lives_on_in_the_history_table(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """Events beyond the memory's tail move to the history table in chunks, a ring of 2 for a history of 12: 30
    reports make 3 chunks (round the ring once) and a tail of 6, and the memory shows its last 12 changes, in order;
    deleting the memory deletes its chunks, and its namespace's forgetting the others'."""
    service = make_service(embedder, tmp_path / "data", engine, q_history_size=12)
    try:
        async with Client(create_server(service)) as client:
            stored = await call(client, "store_experience", task=MUG, experience="x", namespace="team")
            other = await call(client, "store_experience", task=MUG, experience="x", namespace="other")
            recalls, rewards = [], [round(0.1 * (i % 7) - 0.3, 1) for i in range(30)]
            for namespace in ("team", "other"):
                for reward in rewards:
                    recall = await call(client, "recall_experience", task=MUG, namespace=namespace)
                    await call(client, "report_outcome", recall_id=recall["recall_id"], reward=reward)
                    recalls.append(recall["recall_id"])
            memory = await read_memory(client, stored["id"])
            assert [e["recall_id"] for e in memory["history"]] == recalls[18:30]
            assert [e["reward"] for e in memory["history"]] == rewards[18:]
            assert memory["history"][-1]["q_after"] == pytest.approx(memory["q"]) and is_chain(memory["history"])
            assert service._store.count("history", {"memory": stored["id"]}) == 2  # a ring of 12 / 8 chunks, rounded up

            await call(client, "forget_experience", memory_id=stored["id"])
            assert service._store.count("history", {"memory": stored["id"]}) == 0
            assert service._store.count("history", {"memory": other["id"]}) > 0
            await call(client, "forget_experience", namespace="other")
            assert service._store.count("history") == 0
    finally:
        service.close()


async def test_a_stalled_writers_late_copy_of_a_tail_hides_no_newer_event(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """A report's update that read a full tail, stalled, and copies it only after the memory has moved on by more
    chunks than a reader keeps (its conditional write then loses) must not overwrite a newer chunk: the memory still
    shows its last 12 changes. With one slot per chunk number modulo the chunks kept (a ring), the late copy of
    chunk 0 landed in chunk 2's slot and the history lost 8 events."""
    service = make_service(embedder, tmp_path / "data", engine, q_history_size=12)
    try:
        async with Client(create_server(service)) as client:
            stored = await call(client, "store_experience", task=MUG, experience="x")
            recalls = []
            for i in range(30):
                if i == 8:  # the tail is full: what the stalled writer read
                    stale = service._store.get("memories", [stored["id"]])[stored["id"]]
                recall = await call(client, "recall_experience", task=MUG)
                await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
                recalls.append(recall["recall_id"])
            late = QEvent(at=0.0, event="reward", reward=1.0, q_before=0.0, q_after=1.0, recall_id="late")
            service._ledger.history.append(stored["id"], stale, late)  # its write would now lose the race
            memory = await read_memory(client, stored["id"])
            assert [e["recall_id"] for e in memory["history"]] == recalls[18:30]
            assert memory["history"][-1]["q_after"] == pytest.approx(memory["q"]) and is_chain(memory["history"])
    finally:
        service.close()


async def test_concurrent_reports_across_the_tail_show_each_change_once(client: Client) -> None:
    """Reports of one memory at once, while its tail moves to the history table (tools run in worker threads,
    optimistic writes lose races): the history holds each reward once, in a chain that ends at the memory's Q."""
    stored = await call(client, "store_experience", task=MUG, experience="original")
    recalls = [(await call(client, "recall_experience", task=MUG))["recall_id"] for _ in range(30)]
    async with anyio.create_task_group() as group:
        for recall_id in recalls:
            group.start_soon(partial(call, client, "report_outcome", recall_id=recall_id, reward=1.0))
    memory = await read_memory(client, stored["id"])
    assert memory["visits"] == len(recalls)
    assert sorted(e["recall_id"] for e in memory["history"]) == sorted(recalls)
    assert memory["history"][-1]["q_after"] == pytest.approx(memory["q"]) and is_chain(memory["history"])


async def test_concurrent_edits_and_reports_lose_nothing(client: Client, service: MemoryService) -> None:
    """Reports and edits of one memory at once, from concurrent callers (tools run in worker threads): every
    reward is folded in once, and the memory ends with one whole edit (its experience and metadata together)."""
    stored = await call(client, "store_experience", task=MUG, experience="original")
    recalls = [(await call(client, "recall_experience", task=MUG))["recall_id"] for _ in range(12)]
    edits = 12

    async def report(recall_id: str) -> None:
        await call(client, "report_outcome", recall_id=recall_id, reward=1.0)

    async def edit(i: int) -> None:
        await call(client, "update_memory", memory_id=stored["id"], experience=f"edit {i}", metadata={"edit": i})

    async with anyio.create_task_group() as group:
        for i in range(max(len(recalls), edits)):
            if i < len(recalls):
                group.start_soon(report, recalls[i])
            if i < edits:
                group.start_soon(edit, i)
    memory = await read_memory(client, stored["id"])
    assert memory["visits"] == len(recalls)
    assert memory["q"] == pytest.approx(1 - 0.7 ** len(recalls))
    assert sorted(e["recall_id"] for e in memory["history"]) == sorted(recalls)
    assert memory["experience"] == f"edit {memory['metadata']['edit']}"


@pytest.mark.slow  # a child process
def test_the_benchmark_runs_at_a_tiny_size() -> None:
    """perf/list_memories.py (the README's figures) checks its pages against a scan-and-sort baseline."""
    printed = run("list_memories.py", "--sizes", "200", "--runs", "2")
    assert "scan+sort" in printed and "qdrant-local" in printed


async def test_list_is_a_lookup_and_update_a_write(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path / "data", tool_profile="read_only")
    try:
        async with Client(create_server(service)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
    finally:
        service.close()
    assert "list_memories" in tools and "update_memory" not in tools  # a frozen memory can be read, not edited
    assert hints(tools["list_memories"]).read_only_hint is True
    schema = tools["list_memories"].input_schema
    assert schema["additionalProperties"] is False
    limit = schema["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 100)
    assert schema["properties"]["text"]["maxLength"] == 200
    assert schema["properties"]["sort"]["enum"] == ["q", "visits", "updated_at"]


@pytest.fixture
async def tenants(tmp_path: Path) -> AsyncIterator[tuple[Client, Client]]:
    with (
        http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tokens_file(tmp_path))) as server,
        anyio.fail_after(DEADLINE_S),
    ):
        async with mcp_client(server, ALICE) as alice, mcp_client(server, BOB) as bob:
            yield alice, bob


@pytest.mark.slow  # a server process
async def test_a_tenant_cannot_list_or_update_another_tenants_memories(tenants: tuple[Client, Client]) -> None:
    alice, bob = tenants
    mine = await call(alice, "store_experience", task=MUG, experience="alice's procedure", metadata={"a": 1})
    await call(bob, "store_experience", task=MUG, experience="bob's procedure")

    listed = await call(bob, "list_memories", limit=100)
    assert listed["namespace"] == "bob" and [m["experience"] for m in listed["memories"]] == ["bob's procedure"]
    assert "not one of the namespaces" in await refused(bob, "list_memories", namespace="alice")
    assert "not one of the namespaces" in await refused(bob, "list_memories", namespace="alice", text="mug")
    # A cursor names no namespace: bob's listing with a cursor made from alice's page stays in bob's namespaces.
    await call(alice, "store_experience", task="heat milk", experience="microwave")
    cursor = (await call(alice, "list_memories", limit=1))["next_cursor"]
    assert cursor is not None
    after = await call(bob, "list_memories", cursor=cursor, limit=100)
    assert all(m["namespace"] == "bob" for m in after["memories"])

    for arguments in ({"experience": "overwritten by bob"}, {"metadata": {"b": 2}}, {"reset_q": True}):
        message = await refused(bob, "update_memory", memory_id=mine["id"], **arguments)
        assert message.endswith(f"memory_id: no memory {mine['id']!r}")  # as unknown as an id never issued
    untouched = await read_memory(alice, mine["id"])
    assert (untouched["experience"], untouched["metadata"], untouched["history"]) == ("alice's procedure", {"a": 1}, [])
