"""A hostile client against the real server: each test performs an attack of issue 11 and shows it fails.

- metadata built to brick the store (deep nesting, giant integers, NaN, huge keys, non-objects) is refused at
  every entry point (the MCP tools, ``memrl-mcp import``, ``restore``) and the store still opens with every
  earlier memory, on both embedded engines;
- recalls that are never reported cannot pile up: a namespace keeps at most ``max_pending_recalls``;
- the embedding cache cannot tell one tenant what another asked (counted in cache hits, not timed);
- what no SDK client would send (1000-deep JSON, NaN, a 400-digit integer) over raw streamable HTTP changes
  nothing and kills nothing;
- a SIGKILL at any point of ``forget_experience(namespace=...)`` never lets the namespace come back, and forgets
  racing reports give clear refusals.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from memrl_mcp.embeddings import CachedEmbedder, Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import EVERYTHING, Access
from memrl_mcp.memory.archive import restore
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import MemoryView
from memrl_mcp.requests import ForgetRequest, NewExperience, OutcomeReport, RecallQuery, StatsQuery, TrajectoryReport
from memrl_mcp.surface.server import create_server
from memrl_mcp.validation import MAX_METADATA_DEPTH, TrajectoryStep
from tests.support.mcp import call, make_service, refused
from tests.support.servers import child_env, http_server, run_cli

MUG = "put a clean mug in the coffee machine"
TASKS = (
    MUG,
    "sort a CSV file by its second column",
    "resize a PNG image to 64x64 pixels",
    "list the files of /tmp by size",
)


def nested(depth: int, leaf: Any = 1) -> dict[str, Any]:
    """An object ``depth`` containers deep (the top object counts as one)."""
    value: Any = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


HOSTILE_METADATA: dict[str, Any] = {
    "depth 9 (one over the limit)": nested(MAX_METADATA_DEPTH + 1),
    "depth 122 (bricked qdrant-edge's WAL)": nested(122),
    "depth 126 (broke recall and stats)": nested(126),
    "lists 200 deep": {"a": json.loads("[" * 200 + "]" * 200)},
    "a 400-digit integer": {"n": int("9" * 400)},
    "2^53 + 1": {"n": 2**53 + 1},
    "a 129-character key": {"k" * 129: 1},
    "a 100,000-character key": {"k" * 100_000: 1},
    "a list, not an object": [1, 2, 3],
    "a string, not an object": "metadata",
    "a number, not an object": 5,
}
PYTHON_ONLY_METADATA: dict[str, Any] = {  # the SDK's client cannot send these; Python callers and files can
    "depth 1000": nested(1000),
    "NaN": {"x": float("nan")},
    "infinity": {"x": float("inf")},
    "a lone surrogate": {"x": "\ud800"},
    "a tuple": {"x": (1, 2)},
}


def snapshot(service: MemoryService) -> dict[str, MemoryView]:
    return {m.id: m for m in service.memories()}


@pytest.mark.slow  # the CLI in a child process
@pytest.mark.anyio
async def test_hostile_metadata_is_refused_everywhere_and_the_store_reopens_whole(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    data = tmp_path / "data"
    service = make_service(embedder, data, engine)
    try:
        async with Client(create_server(service)) as client:
            for task in TASKS:
                await call(client, "store_experience", task=task, experience="do it well", metadata={"ok": [1, "x"]})
            deepest = await call(client, "store_experience", task="boundary", experience="e", metadata=nested(8))
            recall = await call(client, "recall_experience", task=MUG)
            for name, metadata in HOSTILE_METADATA.items():
                stored = await refused(
                    client, "store_experience", task=f"evil {name}", experience="x", metadata=metadata
                )
                reported = await refused(
                    client,
                    "report_outcome",
                    recall_id=recall["recall_id"],
                    reward=1.0,
                    experience="x",
                    metadata=metadata,
                )
                for message in (stored, reported):
                    assert "metadata" in message, (name, message)
            # Each refusal names the limit.
            message = await refused(client, "store_experience", task="t", experience="e", metadata=nested(9))
            assert f"nested deeper than {MAX_METADATA_DEPTH} levels" in message
            message = await refused(client, "store_experience", task="t", experience="e", metadata={"n": 10**400})
            assert "integer of 401 digits is outside +-2^53" in message
            message = await refused(client, "store_experience", task="t", experience="e", metadata={"k" * 129: 1})
            assert "a key of 129 characters exceeds 128" in message
            # The recall was not spent by the refused reports, and recall and stats work on the namespace.
            report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
            assert len(report["updated"]) >= 1
            assert (await call(client, "memory_stats", namespace="default"))["memories"] == len(TASKS) + 1
        for name, metadata in {**HOSTILE_METADATA, **PYTHON_ONLY_METADATA}.items():
            with pytest.raises(MemoryRequestError, match=r"^metadata"):
                service.store_experience(NewExperience(f"evil {name}", "x", metadata=metadata), access=EVERYTHING)
            (deep,) = [m for m in service.memories() if m.id == deepest["id"]]  # with its times as floats
            memory = deep.model_dump() | {"id": "0c9a3b8e-3d43-4f0e-8f4e-64f3f0a0e3b2"}
            with pytest.raises(MemoryRequestError, match=r"^metadata"):
                restore(service, [MemoryView.model_construct(**(memory | {"metadata": metadata}))])
        before = snapshot(service)
    finally:
        service.close()
    assert len(before) == len(TASKS) + 1

    # memrl-mcp import: every hostile line is named, nothing is written. (Lines that are no memory at all are
    # refused before the others are checked, so they go in a file of their own.)
    template = before[deepest["id"]].model_dump()
    hostile = [*HOSTILE_METADATA.values(), {"x": float("nan")}]
    env = child_env(MEMRL_EMBEDDED_ENGINE=engine)
    for kind, batch in (("not objects", [m for m in hostile if not isinstance(m, dict)]),
                        ("objects", [m for m in hostile if isinstance(m, dict)])):  # fmt: skip
        lines = [
            json.dumps(template | {"id": f"5d1c2f43-9a4f-4d67-8a6e-{i:012d}", "metadata": m})
            for i, m in enumerate(batch, start=1)
        ]
        path = tmp_path / f"hostile {kind}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        result = run_cli("import", str(path), "--data-dir", str(data), env=env)
        assert result.returncode == 2, result.stderr
        assert f"{len(lines)} bad line(s), nothing imported" in result.stderr
        for number in range(1, len(lines) + 1):
            assert f"line {number}: metadata" in result.stderr, result.stderr
    too_deep = tmp_path / "too deep.jsonl"  # deeper than Python's JSON reader goes: named, not a traceback
    too_deep.write_text(json.dumps(template)[:-1] + ', "metadata": ' + '{"a":' * 100_000 + "1" + "}" * 100_001 + "\n")
    result = run_cli("import", str(too_deep), "--data-dir", str(data), env=env)
    assert result.returncode == 2 and "line 1: JSON nested too deep to read" in result.stderr, result.stderr

    # The store opens again with every memory, and exports.
    reopened = make_service(embedder, data, engine)
    try:
        assert snapshot(reopened) == before
        found = reopened.recall(RecallQuery(MUG), access=EVERYTHING)
        assert found.memories and reopened.stats(StatsQuery(), access=EVERYTHING).memories == len(before)
    finally:
        reopened.close()
    exported = run_cli("export", "--data-dir", str(data), env=env)
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stdout.splitlines()) == len(before)


def test_unreported_recalls_are_bounded_per_namespace_oldest_first(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path, max_pending_recalls=10)
    try:
        other = service.recall(RecallQuery(MUG, namespace="other"), access=EVERYTHING)
        recalls = [service.recall(RecallQuery(f"{MUG} #{i}"), access=EVERYTHING) for i in range(30)]
        for _ in recalls:
            assert service.stats(StatsQuery("default"), access=EVERYTHING).recalls_pending <= 10
        pending = service.stats(StatsQuery("default"), access=EVERYTHING).recalls_pending
        assert 9 <= pending <= 10
        oldest, newest = recalls[0], recalls[-1]
        message = r"unknown recall .* max_pending_recalls=10 of its namespace"
        with pytest.raises(MemoryRequestError, match=message):
            service.report(OutcomeReport(oldest.recall_id, 1.0, experience="late"), access=EVERYTHING)
        service.report(OutcomeReport(newest.recall_id, 1.0, experience="in time"), access=EVERYTHING)
        service.report(OutcomeReport(other.recall_id, 1.0), access=EVERYTHING)  # another namespace is untouched
        # The survivors are exactly the newest.
        kept = [r for r in recalls[:-1] if _reportable(service, r.recall_id)]
        assert kept == recalls[len(recalls) - 1 - len(kept) : -1]
    finally:
        service.close()


def _reportable(service: MemoryService, recall_id: str) -> bool:
    try:
        service.report(OutcomeReport(recall_id, 0.0), access=EVERYTHING)
    except MemoryRequestError:
        return False
    return True


def test_the_embedding_cache_tells_no_tenant_what_another_asked(embedder: Embedder, tmp_path: Path) -> None:
    """The timing attack measured a cache hit on another tenant's text; a hit is what must not happen."""
    cached = CachedEmbedder(embedder, size=100)
    settings = make_service(embedder, tmp_path).settings
    service = MemoryService.open(settings, cached)
    alice = Access(namespaces=frozenset({"alice"}), default="alice")
    bob = Access(namespaces=frozenset({"bob"}), default="bob")
    secret = "rotate the database password of the payroll service"
    try:
        service.recall(RecallQuery(secret), access=alice)
        service.recall(RecallQuery(secret), access=bob)  # bob probes alice's text
        assert (cached.hits.get("bob", 0), cached.misses["bob"]) == (0, 1)  # embedded afresh: no faster
        service.search(RecallQuery(secret), access=alice)
        assert cached.hits["alice"] == 1  # the cache still works within a tenant
        with pytest.raises(MemoryRequestError, match="namespace"):  # nor can bob probe in alice's namespace
            service.recall(RecallQuery(secret, namespace="alice"), access=bob)
        assert cached.hits.get("bob", 0) == 0 and cached.hits["alice"] == 1
    finally:
        service.close()


# -- forget under SIGKILL and under concurrent reports ---------------------------------------------

CHILD = """
import os, signal, sys
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import open_store
from memrl_mcp.requests import ForgetRequest

data_dir, engine, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = load_settings(data_dir=data_dir, embedded_engine=engine)
embedder = MiniLMEmbedder()
store = open_store(settings.storage, embedder.dim)


class KilledAtDelete:
    # The real store; the process receives SIGKILL before its kill_at-th bulk delete.
    def __init__(self):
        self.left = kill_at

    def __getattr__(self, name):
        method = getattr(store, name)
        if name != "delete_namespace":
            return method

        def delete_namespace(*args, **kwargs):
            if self.left == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            self.left -= 1
            return method(*args, **kwargs)

        return delete_namespace


service = MemoryService.open(settings, embedder, KilledAtDelete())
print(service.forget(ForgetRequest(namespace="gone"), access=EVERYTHING), flush=True)
"""


FORGET_DELETES = 5  # a namespace's recalls, episodes (the redo logs first), memories, Q history chunks, step records


@pytest.mark.slow  # a child process
@pytest.mark.parametrize("kill_at", [0, 1, 2, 3, 4, FORGET_DELETES])
def test_sigkill_during_forget_never_brings_the_namespace_back(
    embedder: Embedder, tmp_path: Path, engine: str, kill_at: int
) -> None:
    """kill_at: the bulk deletes of a namespace's forget done before the SIGKILL (5: all of them)."""
    service = make_service(embedder, tmp_path, engine)
    try:
        for task in TASKS:
            service.store_experience(
                NewExperience(task, "the forgotten procedure", namespace="gone"), access=EVERYTHING
            )
        kept = service.store_experience(NewExperience(MUG, "kept", namespace="kept"), access=EVERYTHING)
        recalls = [service.recall(RecallQuery(task, namespace="gone"), access=EVERYTHING).recall_id for task in TASKS]
        steps = [TrajectoryStep(observation=f"screen {i}", action="press enter", reward=0.0) for i in range(3)]
        service.report_trajectory(TrajectoryReport(TASKS[0], steps, "episode", namespace="gone"), access=EVERYTHING)
    finally:
        service.close()

    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), engine, str(kill_at)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if kill_at < FORGET_DELETES:
        assert child.returncode == -signal.SIGKILL, child.stderr
    else:
        assert child.returncode == 0 and "deleted=4 steps_deleted=3" in child.stdout, child.stderr

    reopened = make_service(embedder, tmp_path, engine)
    try:
        left = reopened.stats(StatsQuery("gone"), access=EVERYTHING).memories
        if kill_at == 0:  # killed before anything was deleted: nothing was forgotten yet
            assert left == len(TASKS)
        else:  # the recalls went first: not one can be reported, whatever memories are left
            assert left == (len(TASKS) if kill_at <= 2 else 0)
            for recall_id in recalls:
                with pytest.raises(MemoryRequestError, match=r"unknown recall .* its namespace was forgotten"):
                    reopened.report(OutcomeReport(recall_id, 1.0, experience="REVIVED"), access=EVERYTHING)
        assert (
            reopened.forget(ForgetRequest(namespace="gone"), access=EVERYTHING).deleted == left
        )  # forget again: completes
        for recall_id in recalls:
            with pytest.raises(MemoryRequestError, match="unknown recall"):
                reopened.report(OutcomeReport(recall_id, 1.0, experience="REVIVED"), access=EVERYTHING)
        assert reopened.stats(StatsQuery("gone"), access=EVERYTHING).memories == 0
        assert (
            reopened.stats(StatsQuery("gone"), access=EVERYTHING).steps,
            reopened.stats(StatsQuery(), access=EVERYTHING).steps,
        ) == (0, 0)
        assert [m.namespace for m in reopened.memories()] == ["kept"]
        assert reopened.get(kept.id, access=EVERYTHING).experience == "kept"
    finally:
        reopened.close()


@pytest.mark.parametrize("round_", range(3))
def test_forget_racing_reports_refuses_clearly_and_leaves_nothing(
    embedder: Embedder, tmp_path: Path, engine: str, round_: int
) -> None:
    service = make_service(embedder, tmp_path, engine)
    try:
        for task in TASKS:
            service.store_experience(NewExperience(task, "procedure", namespace="ns"), access=EVERYTHING)
        recalls = [
            service.recall(RecallQuery(TASKS[i % len(TASKS)], namespace="ns"), access=EVERYTHING) for i in range(24)
        ]
        barrier = threading.Barrier(len(recalls) + 1)
        outcomes: list[object] = []

        def report(recall_id: str, i: int) -> None:
            barrier.wait()
            try:
                outcomes.append(
                    service.report(OutcomeReport(recall_id, 1.0, experience=f"new experience {i}"), access=EVERYTHING)
                )
            except Exception as error:  # every exception is inspected below
                outcomes.append(error)

        def forget() -> None:
            barrier.wait()
            outcomes.append(service.forget(ForgetRequest(namespace="ns"), access=EVERYTHING))

        threads = [threading.Thread(target=report, args=(r.recall_id, i)) for i, r in enumerate(recalls)]
        threads.insert(len(threads) // 2, threading.Thread(target=forget))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        errors = [o for o in outcomes if isinstance(o, Exception)]
        for error in errors:
            assert isinstance(error, MemoryRequestError), repr(error)
            assert str(error).startswith("recall_id: ") and ("forgotten" in str(error)), str(error)
        assert len(outcomes) == len(recalls) + 1
        # Whatever finished before the forget was forgotten with it; whatever came after was refused.
        assert service.stats(StatsQuery("ns"), access=EVERYTHING).memories == 0
        assert service.stats(StatsQuery("ns"), access=EVERYTHING).recalls_pending == 0
    finally:
        service.close()


# -- a raw client over streamable HTTP: what no SDK client would send -------------------------------

RAW_ARGUMENTS = {  # JSON text of the metadata argument, as a fuzzing client writes it
    "depth 150": '{"a":' * 149 + "1" + "}" * 149,
    "depth 1000": '{"a":' * 999 + "1" + "}" * 999,  # beyond the SDK's JSON parser: a parse error
    "lists 5000 deep": '{"a":' + "[" * 5000 + "]" * 5000 + "}",
    "a 400-digit integer": '{"n":' + "9" * 400 + "}",
    "NaN (not JSON)": '{"x":NaN}',
    "Infinity (not JSON)": '{"x":Infinity}',
    "a lone surrogate": '{"x":"\\ud800"}',  # refused by the SDK's JSON parser
}


@pytest.mark.slow  # a server process
def test_raw_http_payloads_change_nothing_and_the_server_restarts(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    data = tmp_path / "data"
    service = make_service(embedder, data, engine)
    try:
        for task in TASKS:
            service.store_experience(NewExperience(task, "kept"), access=EVERYTHING)
        before = snapshot(service)
    finally:
        service.close()

    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with http_server(data, tmp_path, MEMRL_EMBEDDED_ENGINE=engine) as server, httpx.Client(timeout=30) as http:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}
        opened = http.post(
            server.url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        )
        assert opened.status_code == 200, opened.text
        session = headers | {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        http.post(server.url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        for number, (name, metadata) in enumerate(RAW_ARGUMENTS.items(), start=1):
            for tool, arguments in (
                ("store_experience", f'{{"task":"evil {name}","experience":"x","metadata":{metadata}}}'),
                ("recall_experience", f'{{"task":"evil","k1":{metadata}}}'),
            ):
                body = f'{{"jsonrpc":"2.0","id":{number},"method":"tools/call","params":{{"name":"{tool}",'
                body += f'"arguments":{arguments}}}}}'
                response = http.post(server.url, headers=session, content=body.encode())
                assert response.status_code in (200, 400), (name, response.status_code, response.text)
                answer = response.json()
                refused_ = "error" in answer or answer.get("result", {}).get("isError") is True
                assert refused_, (name, tool, answer)
                if tool == "store_experience" and name in ("depth 150", "a 400-digit integer"):
                    assert "metadata" in json.dumps(answer), answer  # refused by the contract, not a crash
                assert server.proc.poll() is None, f"the server died on {name}"
        stats = http.post(
            server.url,
            headers=session,
            json={
                "jsonrpc": "2.0",
                "id": 99,
                "method": "tools/call",
                "params": {"name": "memory_stats", "arguments": {}},
            },
        )
        assert stats.json()["result"]["structuredContent"]["memories"] == len(TASKS)

    reopened = make_service(embedder, data, engine)  # the server stopped; the store opens with every memory
    try:
        assert snapshot(reopened) == before
    finally:
        reopened.close()
