"""One tenant cannot fill the disk the others share (issue 22.3): each namespace has a storage quota, every call that
grows a namespace is refused at it with a message naming it, and forgetting gives the disk back.

The attack runs against the real HTTP server with two tokens: bob fills his namespace through every tool that
writes, alice keeps writing, bob forgets his namespace and the store's folder shrinks on disk (``du``)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import yaml

from memrl_mcp.embeddings import Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import admission
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.requests import ForgetRequest, MemoryEdit, NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.settings import SettingsError, load_settings
from memrl_mcp.storage import EdgeStore, Point, Store, Table, quota
from memrl_mcp.storage.quota import GIVE_BACK_EVERY, MeteredStore
from memrl_mcp.storage.store import TABLES, vector_size
from tests.support.mcp import call, make_service, refused
from tests.support.servers import ALICE, BOB, child_env, http_server, mcp_client, run_cli

MB = 1 << 20
BOB_QUOTA_MB = 4
LONG = 15_000  # characters of experience: bob reaches his quota in ~200 memories
QUOTA_REFUSAL = re.compile(
    r"namespace: '(?P<namespace>\w+)' is at its storage quota: (?P<used>[\d.]+) MB stored of (?P<quota>\d+) MB "
    r"\(namespace_quota_mb\).*Forget what is no longer needed to make room \(forget_experience"
)


def text(seed: int, chars: int) -> str:
    """Distinct, incompressible-looking text (the engine's storage does not compress it away)."""
    words: list[str] = []
    state = seed * 2654435761 % (1 << 32) or 1
    while sum(len(w) + 1 for w in words) < chars:
        state = state * 1103515245 + 12345 & 0x7FFFFFFF
        words.append(format(state, "x"))
    return " ".join(words)[:chars]


def du_mb(folder: Path) -> float:
    """Disk space the folder's files take, as ``du`` counts it (allocated blocks, holes excluded). A compaction may
    remove a retired generation while ``du`` walks it (``du`` then exits 1): counted again once it is gone."""
    for _ in range(20):
        done = subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True)
        if done.returncode == 0:
            return int(done.stdout.split()[0]) / 1024
        time.sleep(0.05)
    raise AssertionError(f"du {folder}: {done.stderr}")


def tokens_file(tmp_path: Path, bob_quota_mb: int = BOB_QUOTA_MB) -> Path:
    path = tmp_path / "tokens.yaml"
    grants = [
        {"name": "alice", "token": ALICE, "namespaces": ["alice"]},
        {"name": "bob", "token": BOB, "namespaces": ["bob"], "namespace_quota_mb": bob_quota_mb},
    ]
    path.write_text(yaml.safe_dump({"tokens": grants}))
    return path


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_bob_fills_his_quota_alice_still_writes_and_forgetting_gives_the_disk_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {"MEMRL_TOKENS_FILE": str(tokens_file(tmp_path)), "MEMRL_NAMESPACE_QUOTA_MB": "64"}
    with http_server(data_dir, tmp_path, **env) as server, anyio.fail_after(600):
        async with mcp_client(server, BOB) as bob, mcp_client(server, ALICE) as alice:
            early = await call(bob, "recall_experience", task="an early task")  # to report once he is full
            message, stored = "", []
            for i in range(1000):
                result = await bob.call_tool(
                    "store_experience", {"task": f"bob's job {i}", "experience": text(i, LONG)}
                )
                if result.is_error:
                    message = " ".join(getattr(block, "text", "") for block in result.content)
                    break
                stored.append(result.structured_content["id"])
            refusal = QUOTA_REFUSAL.search(message)
            assert refusal is not None, message
            assert (refusal["namespace"], refusal["quota"]) == ("bob", str(BOB_QUOTA_MB))
            assert BOB_QUOTA_MB - 0.1 < float(refusal["used"]) <= BOB_QUOTA_MB
            assert len(stored) > 100  # filled by writes, not refused from the start
            recalls = 1
            while not (result := await bob.call_tool("recall_experience", {"task": f"fill {recalls}"})).is_error:
                recalls += 1  # the last few KB, by the smallest write there is
            assert QUOTA_REFUSAL.search(" ".join(getattr(block, "text", "") for block in result.content))

            # Every other call that grows his namespace is refused the same way; nothing of them is stored.
            for tool, arguments in {
                "store_experience": {"task": "a short one", "experience": "short"},
                "report_outcome": {"recall_id": early["recall_id"], "reward": 1.0, "experience": text(1, LONG)},
                "report_trajectory": {
                    "task": "a long episode",
                    "steps": [{"observation": text(j, 4000), "action": "look", "reward": 0.0} for j in range(5)],
                    "episode_id": "e1",
                },
                "update_memory": {"memory_id": stored[0], "experience": text(2, 19_000)},
            }.items():
                assert QUOTA_REFUSAL.search(await refused(bob, tool, **arguments)), tool
            stats = await call(bob, "memory_stats")
            assert (stats["memories"], stats["recalls_pending"], stats["steps"]) == (len(stored), recalls, 0)

            # alice, on the same server and disk, writes as usual.
            mine = await call(alice, "store_experience", task="alice's task", experience=text(7, LONG))
            recall = await call(alice, "recall_experience", task="alice's task")
            await call(alice, "report_outcome", recall_id=recall["recall_id"], reward=1.0, experience="it worked")

            # bob forgets his namespace: the store gives the disk back, in the background, soon after.
            before = du_mb(data_dir)
            forgotten = await call(bob, "forget_experience", namespace="bob")
            assert forgotten["deleted"] == len(stored)
            deadline = time.monotonic() + 120
            while du_mb(data_dir) > before - 0.9 * BOB_QUOTA_MB and time.monotonic() < deadline:
                await anyio.sleep(0.5)
            after = du_mb(data_dir)
            assert after <= before - 0.9 * BOB_QUOTA_MB, (before, after)
            print(f"bob's {BOB_QUOTA_MB} MB quota forgotten: the store went from {before:.1f} to {after:.1f} MB")

            # and writes again; alice's memory is untouched.
            await call(bob, "store_experience", task="bob starts over", experience=text(9, LONG))
            assert (await call(alice, "search_experience", task="alice's task"))["memories"][0]["id"] == mine["id"]


REWRITES = {"edge": 1000, "qdrant-local": 200}  # qdrant-local rewrites a 15,000-character point in ~0.2 s
REWRITTEN_TASK = "summarise the nightly build log"
REWRITES_BOUND_MB = 12


@pytest.mark.slow  # a real HTTP server, restarted
@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["update_memory", "store_experience"])
async def test_rewriting_one_memory_cannot_grow_the_disk_past_a_bound(tmp_path: Path, tool: str, engine: str) -> None:
    """bob (namespace_quota_mb: 1) stores one memory of 15,000 characters, then rewrites it with a new 15,000-character
    experience again and again: through update_memory, or through store_experience of the same task, which keeps at most
    ``max_task_variants`` (3) variants of the task, the weakest replaced (the default core profile). qdrant-edge kept
    every replaced version and the log of every write until a flush: the store grew linearly (96 MB after 3,600
    rewrites) and nothing refused or gave it back. Now the versions a namespace's rewrites replace count in its usage
    until a flush lets the engine reuse them, a namespace at its quota has them flushed, and the log's segments are
    small: the store stays small, through a close and a reopen. A refusal, if any, names the quota."""
    data_dir = tmp_path / "data"
    env = {"MEMRL_TOKENS_FILE": str(tokens_file(tmp_path, bob_quota_mb=1)), "MEMRL_EMBEDDED_ENGINE": engine}
    profile = {"MEMRL_TOOL_PROFILE": "core"} if tool == "store_experience" else {}
    rewrites, sizes, refusals = REWRITES[engine], [], 0
    with http_server(data_dir, tmp_path, **env, **profile) as server:
        async with mcp_client(server, BOB) as bob:
            first = await call(bob, "store_experience", task=REWRITTEN_TASK, experience=text(0, LONG))
            ids, last = {first["id"]}, first["id"]
            for i in range(1, rewrites + 1):
                if tool == "update_memory":
                    arguments = {"memory_id": first["id"], "experience": text(i, LONG)}
                else:
                    arguments = {"task": REWRITTEN_TASK, "experience": text(i, LONG)}
                result = await bob.call_tool(tool, arguments)
                if result.is_error:
                    message = " ".join(getattr(block, "text", "") for block in result.content)
                    assert QUOTA_REFUSAL.search(message), message
                    refusals += 1
                    await anyio.sleep(GIVE_BACK_EVERY)
                else:
                    assert result.structured_content is not None
                    last = result.structured_content["id"]
                    ids.add(last)
                if i % (rewrites // 6) == 0:
                    sizes.append(du_mb(data_dir))
    variants = 1 if tool == "update_memory" else 3
    assert ids == {first["id"]} if tool == "update_memory" else len(ids) >= variants  # new variants, in place
    closed = du_mb(data_dir)
    with http_server(data_dir, tmp_path, **env) as server:
        async with mcp_client(server, BOB) as bob:
            assert (await call(bob, "memory_stats"))["memories"] == variants
            memory = await call(bob, "update_memory", memory_id=last, experience="the last word")
            assert memory["experience"] == "the last word"
    reopened = du_mb(data_dir)
    print(f"{engine}, {rewrites} rewrites by {tool}: {sizes} MB, {closed:.1f} closed, {reopened:.1f} reopened; "
          f"{refusals} refused")  # fmt: skip
    assert max(*sizes, closed, reopened) <= REWRITES_BOUND_MB
    assert refusals <= rewrites // 20


def test_the_versions_a_rewrite_replaces_count_until_the_store_reuses_them(
    embedder: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qdrant-edge keeps a rewritten record's replaced version until a flush: a namespace's usage counts it. With the
    flushes made for a namespace at its quota held back (one allowed an hour), a tenant rewriting one memory of
    15,000 characters under namespace_quota_mb 1 is refused by name at the quota, told how much of its usage is
    replaced versions, and holds no more than its quota; once a flush is allowed, the next rewrite gets the room
    back and applies, and the usage is its records' again. On the code before, no rewrite was ever refused."""
    monkeypatch.setattr(quota, "GIVE_BACK_EVERY", 3600.0)
    service = make_service(embedder, tmp_path / "data", namespace_quota_mb=1)
    store = service._store
    try:
        memory = service.store_experience(
            NewExperience("summarise the build log", text(0, LONG), "ns"), access=EVERYTHING
        )
        refusal, rewrites = "", 0
        while not refusal and rewrites < 400:
            rewrites += 1
            try:
                service.update_memory(MemoryEdit(memory.id, experience=text(rewrites, LONG)), access=EVERYTHING)
            except admission.QuotaExceededError as error:
                refusal = str(error)
        assert QUOTA_REFUSAL.search(refusal) and "versions that rewrites replaced" in refusal, refusal
        assert rewrites > 50  # the quota filled by replaced versions: ~17 KB each
        used = store.usage("ns")
        assert used is not None and used <= MB
        monkeypatch.setattr(quota, "GIVE_BACK_EVERY", 0.0)
        service.update_memory(MemoryEdit(memory.id, experience=text(rewrites + 1, LONG)), access=EVERYTHING)
        held = (store.usage("ns") or 0) - recount(store, "ns")
        assert 0 < held < 2 * LONG  # the room given back first: only the version this rewrite replaced
    finally:
        service.close()


@pytest.mark.slow  # rebuilds tables in child processes
def test_concurrent_writers_never_overshoot_the_quota_and_the_count_is_exact(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """16 threads race to fill one namespace: what they may add is reserved as they are admitted, so together
    they stop at the quota; the usage kept write by write equals a full recount afterwards."""
    service = make_service(embedder, tmp_path / "data", engine, namespace_quota_mb=1)
    store = service._store
    try:
        assert isinstance(store, MeteredStore)
        refusals: list[str] = []

        def writer(n: int) -> None:
            for i in range(40):
                try:
                    service.store_experience(
                        NewExperience(f"job {n}-{i}", text(n * 100 + i, 8000), namespace="busy"), access=EVERYTHING
                    )
                except MemoryRequestError as error:
                    refusals.append(str(error))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert refusals and all(QUOTA_REFUSAL.search(r) for r in refusals)
        used = store.usage("busy")
        assert used is not None and used <= MB
        assert counted(store, "busy") == recount(store, "busy")
        service.store_experience(
            NewExperience("elsewhere", "another namespace has its own quota", namespace="calm"), access=EVERYTHING
        )
    finally:
        service.close()


def recount(store: Store, namespace: str) -> int:
    assert isinstance(store, MeteredStore)
    return store._recount().of(namespace)


def counted(store: Store, namespace: str) -> int | None:
    """The usage kept write by write, once every table is flushed: its records' bytes alone, without the versions
    their writes replaced (which the flush lets the engine reuse)."""
    for table in TABLES:
        store.flush(table)
    return store.usage(namespace)


KILLED_WRITER = """
import os, signal, sys
from memrl_mcp.memory import admission
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import load_settings
from memrl_mcp.requests import ForgetRequest, NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.storage.store import TABLES
service = MemoryService.open(load_settings(data_dir=sys.argv[1]))
for i in range(30):
    service.store_experience(NewExperience(f"job {i}", "lesson " * (50 * i + 1), namespace="ns"), access=EVERYTHING)
recall = service.recall(RecallQuery("job 3", namespace="ns"), access=EVERYTHING)
service.report(OutcomeReport(recall.recall_id, 1.0, experience="more " * 500), access=EVERYTHING)
service.forget(ForgetRequest(namespace="gone"), access=EVERYTHING)
for table in TABLES:
    service._store.flush(table)  # the versions its writes replaced are reused: the usage is the records' alone
print(service._store.usage("ns"), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow  # a child process
def test_the_usage_is_counted_again_after_a_crash(embedder: Embedder, tmp_path: Path) -> None:
    """A writer killed without closing saves no usage: the next open counts it again, to the byte."""
    data_dir = tmp_path / "data"
    service = make_service(embedder, data_dir)
    service.store_experience(NewExperience("kept", "from before", namespace="ns"), access=EVERYTHING)
    service.store_experience(
        NewExperience("gone", "forgotten by the killed writer", namespace="gone"), access=EVERYTHING
    )
    service.close()
    assert (data_dir / "memrl" / "edge" / "usage.json").exists()  # a clean close saved it

    child = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(data_dir)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert not (data_dir / "memrl" / "edge" / "usage.json").exists()  # deleted as it was read: no stale count
    reopened = make_service(embedder, data_dir)
    try:
        assert reopened._store.usage("ns") == int(child.stdout) > 0
        assert reopened._store.usage("gone") == 0
    finally:
        reopened.close()


@pytest.mark.slow  # the CLI in a child process
def test_an_import_over_the_quota_is_refused_whole(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = [
        {"kind": "memory", "id": f"00000000-0000-4000-8000-{i:012d}", "namespace": "big", "task": f"task {i}",
         "experience": text(i, 10_000), "outcome": "success", "q": 0.0, "visits": 0, "last_reward": None,
         "merges": 0, "created_at": 1.7e9, "updated_at": 1.7e9, "metadata": {}}
        for i in range(200)
    ]  # fmt: skip
    backup = tmp_path / "backup.jsonl"
    backup.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = child_env(MEMRL_NAMESPACE_QUOTA_MB="1")
    done = run_cli("import", str(backup), "--data-dir", str(tmp_path / "data"), env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    refusal = QUOTA_REFUSAL.search(done.stderr)
    assert refusal is not None and refusal["namespace"] == "big", done.stderr
    assert "nothing imported" in done.stderr
    exported = run_cli("export", "--data-dir", str(tmp_path / "data"), env=env)
    assert exported.returncode == 0 and exported.stdout == "", exported.stderr

    done = run_cli("import", str(backup), "--data-dir", str(tmp_path / "data"), env=child_env(), timeout=600)
    assert done.returncode == 0, done.stderr  # under the default quota it fits


def test_a_token_sets_the_quota_of_the_namespaces_it_names(embedder: Embedder, tmp_path: Path) -> None:
    grants = [
        {"name": "small", "token": "s" * 16, "namespaces": ["team", "solo"], "namespace_quota_mb": 2},
        {"name": "large", "token": "l" * 16, "namespaces": ["team"], "namespace_quota_mb": 50},
        {"name": "plain", "token": "p" * 16, "namespaces": ["own"]},
        {"name": "admin", "token": "a" * 16, "namespaces": ["*"]},
    ]
    service = make_service(embedder, tmp_path / "data", tokens=grants, namespace_quota_mb=10)
    try:  # a namespace several tokens name gets the largest of their quotas; unnamed ones the setting's
        assert [service.quotas.of(ns) for ns in ("team", "solo", "own", "other")] == [50, 2, 10, 10]
    finally:
        service.close()
    with pytest.raises(SettingsError, match='namespace_quota_mb applies to the namespaces a token names, and "\\*"'):
        load_settings(tokens=[{"name": "admin", "token": "x" * 16, "namespaces": ["*"], "namespace_quota_mb": 5}])


@pytest.mark.slow  # rebuilds tables in child processes
@pytest.mark.parametrize("table", ["recalls", "steps", "episodes", "memories"])
def test_a_compaction_keeps_every_write_made_during_it_and_drops_the_deleted(tmp_path: Path, table: Table) -> None:
    """A table is rebuilt from its live points while writes go on: every one of them is in the new generation,
    the deleted points are not, on disk either, and a reopen finds the same."""
    rng = np.random.default_rng(0)
    size = vector_size(table, 384)

    def point(i: int, namespace: str) -> Point:
        payload = {"namespace": namespace, "status": "pending", "version": 0, "blob": text(i, 5000)}
        return Point(str(uuid.UUID(int=i + 1, version=4)), rng.standard_normal(size).astype(np.float32), payload)

    path = tmp_path / "edge"
    store = EdgeStore(path, 384)
    try:
        points = [point(i, "kept" if i % 2 else "gone") for i in range(600)]
        for first in range(0, len(points), 100):
            store.upsert(table, points[first : first + 100])
        store.delete_namespace(table, "gone")
        before = du_mb(path / table)

        store.compact(table)  # in the background: the writes below land while the child streams and writes
        added = [point(1000 + i, "kept") for i in range(50)]
        store.upsert(table, added)
        kept = [p for p in points if p.payload["namespace"] == "kept"]
        for p in kept[:40]:
            store.set_payload_if(table, p.id, {"status": "reported", "version": 1}, {"version": 0})
            store.set_payload_if(table, p.id, {"status": "lost", "version": 9}, {"version": 0})  # loses: no-op
        store.delete(table, [p.id for p in kept[40:60]])
        store.compact(table, wait=True)  # queued behind the first: it is over too

        expected = {p.id: p.payload for p in kept[60:] + added}
        expected |= {p.id: p.payload | {"status": "reported", "version": 1} for p in kept[:40]}
        assert dict(store.scroll(table)) == expected
        generation = (path / f"{table}.current").read_text()
        assert [p.name for p in path.iterdir() if p.is_dir() and p.name.startswith(table)] == [generation]
        after = du_mb(path / generation)
        assert after < 0.7 * before, (before, after)
    finally:
        store.close()
    reopened = EdgeStore(path, 384)
    try:
        assert dict(reopened.scroll(table)) == expected
    finally:
        reopened.close()


@pytest.mark.slow  # rebuilds tables in child processes
def test_a_small_forget_is_given_back_at_the_next_check(tmp_path: Path) -> None:
    """Below 20% of its table, a forgotten namespace waits for the hourly check, which the next open also makes
    (the deleted bytes are saved with the usage at close)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "edge"

    def points(namespace: str, first: int, n: int) -> list[Point]:
        vectors = rng.standard_normal((n, 384)).astype(np.float32)
        return [
            Point(str(uuid.UUID(int=i + 1, version=4)), vector, {"namespace": namespace, "blob": text(i, 5000)})
            for i, vector in zip(range(first, first + n), vectors, strict=True)
        ]

    store = MeteredStore(EdgeStore(path, 384), path, 384)
    for first in range(0, 2000, 200):
        store.upsert("memories", points("alice", first, 200))
    store.upsert("memories", points("bob", 10_000, 300))  # 13% of the table
    store.delete_namespace("memories", "bob")
    before = du_mb(path)
    store.close()
    assert not [p for p in path.iterdir() if p.name.startswith("memories-")]  # nothing compacted yet

    store = MeteredStore(EdgeStore(path, 384), path, 384)  # the check at open compacts the memories
    try:
        deadline = time.monotonic() + 60
        while (path / "memories").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the compaction runs in the background; the old generation goes last
        assert du_mb(path) < before - 1.2, (before, du_mb(path))  # bob's 300 records of 5 KB
        assert counted(store, "alice") == recount(store, "alice")
    finally:
        store.close()


def test_the_q_histories_chunks_are_counted_and_given_back(embedder: Embedder, tmp_path: Path, engine: str) -> None:
    """A memory's older Q events live in the history table: the usage kept write by write counts each chunk
    copied there (equal to a full recount), and forgetting the memory, then the namespace, gives them back."""
    service = make_service(embedder, tmp_path / "data", engine)
    store = service._store
    try:
        assert isinstance(store, MeteredStore)
        mug = service.store_experience(
            NewExperience("put a clean mug in the coffee machine", "rinse", "ns"), access=EVERYTHING
        )
        cup = service.store_experience(
            NewExperience("wash the cup and dry it", "soap, then towel", "ns"), access=EVERYTHING
        )
        for task in ["put a clean mug in the coffee machine", "wash the cup and dry it"] * 20:
            recall = service.recall(RecallQuery(task, "ns", k1=1, k2=1), access=EVERYTHING)
            service.report(OutcomeReport(recall.recall_id, 1.0), access=EVERYTHING)
        chunks = store.count("history", {"namespace": "ns"})
        assert chunks == 4  # 20 updates of each memory: two tails of 8 copied
        with_chunks = counted(store, "ns")
        assert with_chunks == recount(store, "ns")
        service.forget(ForgetRequest(memory_id=mug.id), access=EVERYTHING)
        assert store.count("history", {"namespace": "ns"}) == 2
        assert counted(store, "ns") == recount(store, "ns") < with_chunks
        assert service.get(cup.id, access=EVERYTHING).visits == 20
        service.forget(ForgetRequest(namespace="ns"), access=EVERYTHING)
        assert store.count("history") == 0 and counted(store, "ns") == recount(store, "ns") == 0
    finally:
        service.close()
