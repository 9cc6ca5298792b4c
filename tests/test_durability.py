"""Durability: SIGKILL the HTTP server in the middle of a stream of writes; after a restart on the same data
dir every ACKNOWLEDGED write is there, exactly, and nothing is half-done.

A few SDK clients write concurrently, each in a namespace of its own, so that the expected state of every
memory follows from that client's acknowledged results alone: its stores (task, experience), and the
``updated`` chain of its reports (visits consecutive, each q_before the previous q_after). At the kill each
client has at most one call in flight; that call may or may not have landed, and the test accepts exactly
those two outcomes: for a report, either none or all of its memories moved (and re-reporting it then fails
or succeeds accordingly).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memrl_mcp.memory.algorithm import update_q
from tests.support.mcp import call, read_json, refused
from tests.support.servers import http_server

pytestmark = pytest.mark.slow  # kills server processes

CLIENTS = 4
KILL_AFTER_ACKS = 48  # acknowledged writes (stores and reports) of all clients together before the kill
ALPHA = 0.3  # the default learning rate
DEADLINE_S = 120  # one engine's whole test; a hung server fails it instead of hanging CI (a loaded machine: 20-40 s)
VOCABULARY = (
    "sort parse merge resize upload rename compress encrypt index plot fetch clean heat cool slice rinse "
    "csv json image table column drawer fridge mug apple lamp shelf cabinet socket cron user group archive "
    "log mail invoice sensor queue cache graph matrix tensor pixel font backup mirror kernel packet"
)


def random_task(rng: random.Random) -> str:
    """A task unlike any other (word salads stay far below the 0.99 merge threshold)."""
    words = VOCABULARY.split()
    return " ".join(rng.choice(words) for _ in range(8)) + f" #{rng.randrange(10**6)}"


@dataclass
class InFlight:
    """The call a client had sent when the server died: it may or may not have landed."""

    kind: str  # "store" or "report"
    task: str = ""
    experience: str = ""
    recall_id: str = ""
    reward: float = 0.0
    memory_ids: list[str] = field(default_factory=list)

    def report_arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"recall_id": self.recall_id, "reward": self.reward}
        return arguments | ({"experience": self.experience} if self.experience else {})


@dataclass
class Ledger:
    """One client's acknowledged results, in its own namespace."""

    namespace: str
    rng: random.Random
    stored: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (task, experience)
    chains: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)  # id -> (visits, q_before, q_after)
    reported: list[str] = field(default_factory=list)  # acknowledged recall ids
    in_flight: InFlight | None = None

    def state(self, memory_id: str) -> tuple[int, float]:
        """(visits, q) after the last acknowledged report: a stored memory starts at (0, 0.0)."""
        chain = self.chains.get(memory_id)
        return (chain[-1][0], chain[-1][2]) if chain else (0, 0.0)


@dataclass
class Progress:
    acks: int = 0
    killed: bool = False
    enough: anyio.Event = field(default_factory=anyio.Event)

    def ack(self) -> None:
        self.acks += 1
        if self.acks >= KILL_AFTER_ACKS:
            self.enough.set()


async def write_stream(url: str, ledger: Ledger, progress: Progress) -> None:
    """Stores and recall -> report cycles until the server dies; every acknowledgement goes to the ledger."""
    rng, ns = ledger.rng, ledger.namespace
    try:
        async with Client(url) as client:
            while True:
                if len(ledger.stored) < 3 or rng.random() < 0.3:
                    task, experience = random_task(rng), f"steps {rng.randrange(10**9)}: " + random_task(rng)
                    ledger.in_flight = InFlight("store", task=task, experience=experience)
                    result = await call(client, "store_experience", task=task, experience=experience, namespace=ns)
                    assert not result["merged"], result
                    ledger.stored[result["id"]] = (task, experience)
                else:
                    ledger.in_flight = None  # a recall writes only its own record: not tracked
                    task = random_task(rng)  # a new task: the report's experience becomes a new memory, no merge
                    recall = await call(client, "recall_experience", task=task, namespace=ns, delta=-1.0, k1=8, k2=2)
                    ids = [m["id"] for m in recall["memories"]]
                    reward = rng.choice([1.0, -1.0, 0.5, -0.25])
                    experience = f"lesson {rng.randrange(10**9)}" if rng.random() < 0.4 else ""
                    flight = InFlight("report", task, experience, recall["recall_id"], reward, ids)
                    ledger.in_flight = flight
                    result = await call(client, "report_outcome", **flight.report_arguments())
                    assert sorted(c["id"] for c in result["updated"]) == sorted(ids)
                    for change in result["updated"]:
                        chain = ledger.chains.setdefault(change["id"], [])
                        chain.append((change["visits"], change["q_before"], change["q_after"]))
                    if experience:
                        assert not result["stored"]["merged"], result
                        ledger.stored[result["stored"]["id"]] = (task, experience)
                    ledger.reported.append(recall["recall_id"])
                ledger.in_flight = None
                progress.ack()
    except Exception:
        if not progress.killed:
            raise  # a failure before the kill is a real one


def check_chain(ledger: Ledger, memory_id: str) -> None:
    """The acknowledged updates of a memory follow one another: no gap, no repeat, no lost q."""
    visits, q = 0, 0.0
    for v, q_before, q_after in ledger.chains.get(memory_id, []):
        assert (v, q_before) == pytest.approx((visits + 1, q), abs=1e-12), (memory_id, ledger.chains[memory_id])
        visits, q = v, q_after


async def memory(client: Client, memory_id: str) -> dict[str, Any]:
    return await read_json(client, f"memrl://memories/{memory_id}")


async def settle_report_in_flight(client: Client, ledger: Ledger, flight: InFlight) -> None:
    """Report the recall that was in flight again: refused if it had landed (all of it, or redone at open);
    otherwise it goes through now and moves its memories from their acknowledged state (none had moved)."""
    result = await client.call_tool("report_outcome", flight.report_arguments())
    if result.is_error:
        assert "already reported" in " ".join(getattr(block, "text", "") for block in result.content)
        print("report in flight had landed")
        return
    print("report in flight had not landed")
    changes = {c["id"]: c for c in result.structured_content["updated"]}
    assert sorted(changes) == sorted(flight.memory_ids)
    for memory_id, change in changes.items():
        visits, q = ledger.state(memory_id)
        assert (change["visits"], change["q_before"]) == (visits + 1, pytest.approx(q, abs=1e-12)), change


async def check_namespace(client: Client, ledger: Ledger) -> None:
    ns, flight = ledger.namespace, ledger.in_flight
    if flight is not None and flight.kind == "report":
        await settle_report_in_flight(client, ledger, flight)

    # The namespace holds the acknowledged memories, plus the one the call in flight stores: a store's if it
    # landed, a report's experience in any case (the report is complete now), once; nothing else.
    listed = await call(client, "recall_experience", task="anything", namespace=ns, delta=-1.0, k1=100, k2=100)
    found = {m["id"]: m for m in listed["memories"]}
    assert set(ledger.stored) <= set(found)
    extra = set(found) - set(ledger.stored)
    if flight is not None and flight.kind == "report" and flight.experience:
        assert len(extra) == 1, (extra, flight)
    if extra:
        assert flight is not None and flight.experience and len(extra) == 1, (extra, flight)
        print(f"the memory of the {flight.kind} in flight is there")
        landed = await memory(client, extra.pop())
        assert (landed["task"], landed["experience"], landed["visits"]) == (flight.task, flight.experience, 0)

    visits_total = 0
    for memory_id, (task, experience) in ledger.stored.items():
        check_chain(ledger, memory_id)
        view = await memory(client, memory_id)
        assert (view["namespace"], view["task"], view["experience"]) == (ns, task, experience)
        visits, q = ledger.state(memory_id)
        if flight is not None and memory_id in flight.memory_ids:  # the report in flight counts, once
            visits, q = visits + 1, update_q(q, flight.reward, ALPHA)
        assert (view["visits"], view["q"]) == (visits, pytest.approx(q, abs=1e-12)), (memory_id, view)
        visits_total += visits

    for recall_id in ledger.reported:
        assert "already reported" in await refused(client, "report_outcome", recall_id=recall_id, reward=1.0)

    stats = await call(client, "memory_stats", namespace=ns)
    reported = len(ledger.reported) + (flight is not None and flight.kind == "report")
    assert (stats["memories"], stats["visits"], stats["recalls_reported"]) == (len(found), visits_total, reported)


@pytest.mark.anyio
@pytest.mark.parametrize("engine", ["edge", "qdrant-local"])
async def test_acknowledged_writes_survive_sigkill(tmp_path: Path, engine: str) -> None:
    data_dir = tmp_path / "data"
    ledgers = [Ledger(f"client-{i}", random.Random(f"{engine}-{i}")) for i in range(CLIENTS)]
    progress = Progress()
    with anyio.fail_after(DEADLINE_S):
        with http_server(data_dir, tmp_path, MEMRL_EMBEDDED_ENGINE=engine) as server:
            async with anyio.create_task_group() as group:
                for ledger in ledgers:
                    group.start_soon(write_stream, server.url, ledger, progress)
                await progress.enough.wait()
                while not any(ledger.in_flight for ledger in ledgers):  # a write is in flight when it dies
                    await anyio.sleep(0.001)
                at_kill = [ledger.in_flight for ledger in ledgers]
                progress.killed = True
                server.proc.kill()  # SIGKILL: no shutdown handler runs, nothing is flushed on the way out
                server.proc.wait()
                # The calls in flight fail, but an answer the server sent before it died may still be read: that
                # write was acknowledged after all, and its ledger records it (its in_flight moves on).
                await anyio.sleep(0.5)
                group.cancel_scope.cancel()
        assert server.proc.returncode == -9
        assert progress.acks >= KILL_AFTER_ACKS
        assert any(at_kill)
        print("in flight at the kill:", [flight and flight.kind for flight in at_kill])
        print("in flight, unanswered:", [ledger.in_flight and ledger.in_flight.kind for ledger in ledgers])

        with http_server(data_dir, tmp_path, MEMRL_EMBEDDED_ENGINE=engine) as server:
            async with Client(server.url) as client:
                for ledger in ledgers:
                    await check_namespace(client, ledger)
                per_namespace = [await call(client, "memory_stats", namespace=ledger.namespace) for ledger in ledgers]
                stats = await call(client, "memory_stats")
                assert stats["memories"] == sum(s["memories"] for s in per_namespace)
                assert stats["visits"] == sum(s["visits"] for s in per_namespace)
                # Still a working memory: a new store is recalled and learns from a report.
                stored = await call(client, "store_experience", task="after the crash", experience="works")
                recall = await call(client, "recall_experience", task="after the crash")
                assert stored["id"] in [m["id"] for m in recall["memories"]]
                report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
                assert [c["visits"] for c in report["updated"] if c["id"] == stored["id"]] == [1]
