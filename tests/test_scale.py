"""The embedded engine at scale, for correctness (speed is perf/scale.py's): the HNSW index returns what exact
search returns and keeps the namespace filter, writes made while it is built survive its swap, ``memory_stats``
from maintained counts equals a full count after concurrent reports and after a crash, and an import reports its
progress on stderr and imports everything."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import QSummary
from memrl_mcp.requests import ListQuery, MemoryEdit, NewExperience, OutcomeReport, RecallQuery, StatsQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import EdgeStore, Point, open_store
from memrl_mcp.storage.edge import CURRENT, TALLY
from memrl_mcp.storage.edge_index import WARM, release, warm_up
from memrl_mcp.storage.tally import FIELDS, Tally

DIM = 384
NAMESPACES = {"big": 1500, "mid": 400, "tiny": 30}  # tiny: fewer than the planner's full-scan threshold


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def memory(namespace: str, rng: random.Random, version: int = 0) -> dict:
    visits = rng.randint(0, 9)
    return {
        "namespace": namespace,
        "outcome": rng.choice(["success", "failure"]),
        "q": round(rng.uniform(-1, 1), 4) if visits else 0.0,
        "visits": visits,
        "version": version,
    }


def seeded_store(path: Path) -> tuple[EdgeStore, list[Point]]:
    """Clustered vectors (neighbours are close calls, as near-duplicate tasks are), three namespaces of very
    different sizes."""
    rng, prng = np.random.default_rng(0), random.Random(0)
    centres = unit(rng.standard_normal((40, DIM)))
    points = []
    for namespace, n in NAMESPACES.items():
        vectors = unit(centres[rng.integers(0, 40, n)] + rng.standard_normal((n, DIM)) * 0.04)
        points += [Point(str(uuid.UUID(int=prng.getrandbits(128))), v, memory(namespace, prng)) for v in vectors]
    store = EdgeStore(path, DIM)
    for first in range(0, len(points), 500):
        store.upsert("memories", points[first : first + 500])
    return store, points


def full_count(store: EdgeStore) -> Tally:
    return Tally.of(payload for _, payload in store.scroll("memories", fields=FIELDS))


@pytest.mark.slow  # builds the index in a child process
def test_hnsw_returns_what_exact_search_returns_within_the_namespace(tmp_path: Path) -> None:
    store, points = seeded_store(tmp_path / "edge")
    try:
        store.build_index(wait=True)
        assert store.index_status() == (len(points), len(points))  # the index is on: searches use it
        rng = np.random.default_rng(1)
        for point in points[::37]:
            query = unit(point.vector + rng.standard_normal(DIM) * 0.02)
            for namespace in NAMESPACES:
                hnsw = store.search(query, 5, -1.0, {"namespace": namespace})
                exact = store.search(query, 5, -1.0, {"namespace": namespace}, exact=True)
                assert [h.id for h in hnsw] == [h.id for h in exact]
                assert len(hnsw) == 5 and {h.payload["namespace"] for h in hnsw} == {namespace}
    finally:
        store.close()


@pytest.mark.slow  # builds the index in a child process
def test_writes_made_during_a_build_survive_the_swap(tmp_path: Path) -> None:
    store, points = seeded_store(tmp_path / "edge")
    prng = random.Random(2)
    try:
        store.build_index()  # in the background: the writes below land while the child streams and indexes
        added = [Point(str(uuid.uuid4()), unit(np.ones(DIM) + i), memory("mid", prng)) for i in range(50)]
        store.upsert("memories", added)
        for point in points[:40]:
            store.set_payload_if("memories", point.id, {"q": 0.5, "version": 1}, {"version": 0})
            store.set_payload_if("memories", point.id, {"q": 0.9, "version": 9}, {"version": 0})  # loses: no-op
        store.delete("memories", [p.id for p in points[40:60]])
        store.delete_namespace("memories", "tiny")
        store.build_index(wait=True)
        assert (tmp_path / "edge" / CURRENT).read_text().startswith("memories-")
        expected = {p.id: p.payload for p in points[60:] + added if p.payload["namespace"] != "tiny"}
        expected |= {
            p.id: p.payload | {"q": 0.5, "version": 1} for p in points[:40] if p.payload["namespace"] != "tiny"
        }
        stored = {point_id: payload for point_id, payload in store.scroll("memories")}
        assert stored == expected
        assert store.index_status()[1] > 0
        assert store.tally() == full_count(store).total()
    finally:
        store.close()
    reopened = EdgeStore(tmp_path / "edge", DIM)
    try:
        assert {point_id for point_id, _ in reopened.scroll("memories")} == set(expected)
        assert [p.name for p in (tmp_path / "edge").iterdir() if p.name.startswith("memories-")] == [
            (tmp_path / "edge" / CURRENT).read_text()
        ]
    finally:
        reopened.close()


@pytest.mark.slow  # builds the index in a child process
def test_writes_racing_the_swap_are_all_kept(tmp_path: Path) -> None:
    """A writer that never pauses: the shards are flushed while it writes (before each replay round), and each of
    its writes is conditional on the version its previous one left, so one lost in the swap fails the next."""
    store, points = seeded_store(tmp_path / "edge")
    written: dict[str, int] = {}
    failures: list[BaseException] = []
    built = threading.Event()

    def write() -> None:
        i = 0
        try:
            while not built.is_set():
                point = points[i % len(points)]
                version = written.get(point.id, 0)
                assert store.set_payload_if("memories", point.id, {"version": version + 1}, {"version": version})
                written[point.id] = version + 1
                i += 1
        except BaseException as error:  # surfaced below
            failures.append(error)

    writer = threading.Thread(target=write)
    try:
        writer.start()
        store.build_index(wait=True)
        built.set()
        writer.join()
        assert not failures
        assert store.last_build is not None and store.last_build.replayed > 0  # the writes did race the build
        assert {point_id: payload["version"] for point_id, payload in store.scroll("memories")} == written
    finally:
        built.set()
        store.close()
    reopened = EdgeStore(tmp_path / "edge", DIM)
    try:
        assert {point_id: payload["version"] for point_id, payload in reopened.scroll("memories")} == written
    finally:
        reopened.close()


def test_a_build_interrupted_by_a_crash_leaves_the_old_generation_whole(tmp_path: Path) -> None:
    store, points = seeded_store(tmp_path / "edge")
    store.close()
    (tmp_path / "edge" / "memories-1").mkdir()  # a build the crash cut short: no pointer names it
    (tmp_path / "edge" / "memories-1" / "junk").write_text("half a segment")
    reopened = EdgeStore(tmp_path / "edge", DIM)
    try:
        assert not (tmp_path / "edge" / "memories-1").exists()
        assert reopened.index_status()[0] == len(points)
    finally:
        reopened.close()


def test_stats_equal_a_full_count_after_concurrent_reports_and_a_reopen(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine, k1=3, k2=3)
    service = MemoryService.open(settings, embedder)
    tasks = [f"put the {thing} in the {place}" for thing in ("mug", "apple", "key") for place in ("sink", "box")]
    for i, task in enumerate(tasks):
        service.store_experience(NewExperience(task, f"did it {i}", namespace=f"ns{i % 2}"), access=EVERYTHING)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(6):
            namespace = f"ns{rng.randint(0, 1)}"
            recall = service.recall(RecallQuery(rng.choice(tasks), namespace, delta=-1.0), access=EVERYTHING)
            service.report(
                OutcomeReport(recall.recall_id, rng.choice([1.0, -1.0]), f"episode {rng.random()}"), access=EVERYTHING
            )

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _assert_stats_match_a_full_count(service)
    service.close()
    if engine == "edge":
        assert (tmp_path / "memrl" / "edge" / TALLY).exists()  # saved at close, read back below
    reopened = MemoryService.open(settings, embedder)
    try:
        _assert_stats_match_a_full_count(reopened)
    finally:
        reopened.close()


def _assert_stats_match_a_full_count(service: MemoryService) -> None:
    payloads = [view.model_dump() for view in service.memories()]
    assert any(p["visits"] for p in payloads)  # the reports did update memories
    for namespace in (None, "ns0", "ns1"):
        chosen = [p for p in payloads if namespace is None or p["namespace"] == namespace]
        stats = service.stats(StatsQuery(namespace), access=EVERYTHING)
        assert stats.memories == len(chosen)
        assert stats.successes == sum(p["outcome"] == "success" for p in chosen)
        assert stats.visits == sum(p["visits"] for p in chosen)
        qs = np.array([p["q"] for p in chosen])
        expected = [*np.percentile(qs, [0, 25, 50, 75, 100]).tolist(), qs.mean()]
        assert stats.q is not None
        got = [stats.q.min, stats.q.p25, stats.q.median, stats.q.p75, stats.q.max, stats.q.mean]
        assert got == pytest.approx(expected, abs=1e-4)  # the histogram's step


CRASHING_WRITER = """
import os, sys
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import QSummary
from memrl_mcp.settings import load_settings
from memrl_mcp.requests import OutcomeReport, RecallQuery
service = MemoryService.open(load_settings(data_dir=sys.argv[1]))
for i in range(5):
    recall = service.recall(RecallQuery(f"water the plant number {i}", delta=-1.0), access=EVERYTHING)
    service.report(OutcomeReport(recall.recall_id, 1.0, f"watered it {i}"), access=EVERYTHING)
os._exit(0)  # no close: the counts are not saved
"""


@pytest.mark.slow  # a child process
def test_stats_are_recounted_after_a_crash(embedder: Embedder, tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path)
    service = MemoryService.open(settings, embedder)
    service.store_experience(NewExperience("water the plant", "use the can"), access=EVERYTHING)
    service.close()  # saves the counts ...
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(tmp_path)], env=env, check=True, timeout=300)
    assert not (tmp_path / "memrl" / "edge" / TALLY).exists()  # ... which the crashed writer consumed at open
    reopened = MemoryService.open(settings, embedder)
    try:
        _assert_stats_match_a_full_count_single(reopened)
    finally:
        reopened.close()


def _assert_stats_match_a_full_count_single(service: MemoryService) -> None:
    payloads = [view.model_dump() for view in service.memories()]
    stats = service.stats(StatsQuery(), access=EVERYTHING)
    assert stats.memories == len(payloads) > 1
    assert stats.visits == sum(p["visits"] for p in payloads) > 0
    assert stats.q == QSummary.of(Tally.of(payloads).total())


@pytest.mark.slow  # a child process
def test_import_reports_progress_on_stderr_and_imports_everything(tmp_path: Path, engine: str) -> None:
    export = tmp_path / "export.jsonl"
    n = 600  # three batches of the import
    with export.open("w") as out:
        for i in range(n):
            record = {
                "id": str(uuid.UUID(int=i + 1, version=4)),
                "namespace": f"ns{i % 3}",
                "task": f"task number {i}: sort the files by size",
                "experience": "ls -S",
                "outcome": "success",
                "q": 0.25,
                "visits": 1,
                "last_reward": 1.0,
                "merges": 0,
                "created_at": 1700000000.0,
                "updated_at": 1700000000.0,
                "metadata": {},
            }
            out.write(json.dumps(record) + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "MEMRL_DATA_DIR": str(tmp_path / "data"),
        "MEMRL_EMBEDDED_ENGINE": engine,
    }
    done = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "import", str(export)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert f"{n}/{n}" in done.stderr and "imported 600 memories" in done.stderr
    settings = load_settings(data_dir=tmp_path / "data", embedded_engine=engine)
    store = open_store(settings.storage, DIM)
    try:
        assert {point_id for point_id, _ in store.scroll("memories")} == {
            str(uuid.UUID(int=i + 1, version=4)) for i in range(n)
        }
    finally:
        store.close()


@pytest.mark.slow  # builds the index in a child process
def test_lists_full_text_and_edits_work_the_same_on_a_swapped_in_generation(embedder: Embedder, tmp_path: Path) -> None:
    """The child builds every payload index of the memories (the sort keys and full text too), not only the
    namespace the graph needs: list_memories orders by an indexed key, which the engine refuses without one."""
    settings = load_settings(data_dir=tmp_path)
    store = EdgeStore(tmp_path / "edge", embedder.dim)
    service = MemoryService.open(settings, embedder, store)
    try:
        for i in range(40):
            stored = service.store_experience(
                NewExperience(
                    f"rinse mug number {i}" if i % 4 == 0 else f"sort file number {i}",
                    f"step {i}",
                    outcome="success" if i % 3 else "failure",
                    namespace=f"ns{i % 2}",
                ),
                access=EVERYTHING,
            )
            if i % 5 == 0:
                recall = service.recall(
                    RecallQuery(f"rinse mug number {i}", f"ns{i % 2}", delta=-1.0), access=EVERYTHING
                )
                service.report(OutcomeReport(recall.recall_id, 1.0, f"rinsed {i}"), access=EVERYTHING)

        def listings() -> list[list[str]]:
            pages = []
            for namespace in ("ns0", "ns1"):
                for sort in ("q", "visits", "updated_at"):
                    page = service.list_memories(ListQuery(namespace, sort=sort, limit=100), access=EVERYTHING)
                    pages.append([m.id for m in page.memories])
                mugs = service.list_memories(ListQuery(namespace, text="MUG rinse", limit=100), access=EVERYTHING)
                pages.append(sorted(m.id for m in mugs.memories))
            return pages

        before = listings()
        assert all(before)
        store.build_index(wait=True)
        memories, indexed = store.index_status()
        assert memories == indexed >= 40
        assert listings() == before
        edited = service.update_memory(MemoryEdit(stored.id, experience="step 39, corrected"), access=EVERYTHING)
        assert edited.experience == "step 39, corrected"
        assert [
            m.id for m in service.list_memories(ListQuery("ns1", text="corrected"), access=EVERYTHING).memories
        ] == [stored.id]
    finally:
        service.close()


def mapped_kb(folder: Path) -> dict[str, int]:
    """Resident KB of this process's mappings of the files under ``folder``, per file (from /proc/self/smaps)."""
    resident: dict[str, int] = {}
    path = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split(None, 5)
        if "-" in fields[0] and len(fields[0]) > 8 and not fields[0].endswith(":"):  # a mapping's header
            path = fields[5] if len(fields) == 6 else None
        elif fields[0] == "Rss:" and path and path.startswith(f"{folder.resolve()}/"):
            resident[path] = resident.get(path, 0) + int(fields[1])
    return resident


@pytest.mark.slow  # builds the index in a child process
def test_an_indexed_generation_keeps_what_searches_read_resident_and_gives_back_what_a_full_read_mapped(
    tmp_path: Path,
) -> None:
    """The new generation is memory-mapped whole (nothing read at its load), its int8 vectors, graph and namespace
    index are then made resident in the engine's own mappings; a full read's pages (payloads, original vectors) are
    given back, and giving them back loses no write, flushed or not."""
    store, points = seeded_store(tmp_path / "edge")
    try:
        store.build_index(wait=True)
        folder = tmp_path / "edge" / (tmp_path / "edge" / CURRENT).read_text()
        assert warm_up(folder) > 0
        warm = {path: kb for path, kb in mapped_kb(folder).items() if WARM.search(path)}
        names = {Path(path).name for path in warm} | {Path(path).parent.name for path in warm}
        assert "quantized.data" in names and "vector_index" in names  # qdrant-edge's files still have these names
        assert any("-namespac-" in name for name in names)
        int8 = next(path for path in warm if path.endswith("quantized.data"))
        assert warm[int8] * 1024 >= os.path.getsize(int8) - 4096  # every page of the int8 copies is mapped

        before = dict(store.scroll("memories"))
        assert len(before) == len(points)
        read = {path: kb for path, kb in mapped_kb(folder).items() if not WARM.search(path)}
        assert sum(read.values()) > 0  # the full read mapped payload pages
        for point in points[:30]:  # unflushed writes: dirty pages of the mapped files
            store.set_payload_if("memories", point.id, {"q": 0.75, "version": 1}, {"version": 0})
        assert release(folder) > 0
        left = {path: kb for path, kb in mapped_kb(folder).items() if not WARM.search(path)}
        assert sum(left.values()) < sum(read.values())
        # none of the search files' pages given back (the writes above may have mapped a few more)
        assert sum(kb for path, kb in mapped_kb(folder).items() if WARM.search(path)) >= sum(warm.values())
        expected = before | {p.id: before[p.id] | {"q": 0.75, "version": 1} for p in points[:30]}
        assert dict(store.scroll("memories")) == expected
    finally:
        store.close()
    reopened = EdgeStore(tmp_path / "edge", DIM)
    try:
        assert dict(reopened.scroll("memories")) == expected
    finally:
        reopened.close()


def test_an_unindexed_generation_keeps_its_vectors_resident_through_a_full_read(tmp_path: Path) -> None:
    """Memories not yet indexed are searched exactly, every vector of the namespace read: their vectors count among
    the search files (resident after the warm-up), and a full read's release gives back its payload pages only."""
    store, points = seeded_store(tmp_path / "edge")
    folder = tmp_path / "edge" / "memories"
    try:
        assert store.index_status() == (len(points), 0)
        assert warm_up(folder) > 0
        vectors = {path: kb for path, kb in mapped_kb(folder).items() if "/vector_storage/vectors/chunk_" in path}
        assert vectors and all(WARM.search(path) for path in vectors)
        assert sum(vectors.values()) * 1024 >= len(points) * DIM * 4  # every vector is mapped
        assert len(dict(store.scroll("memories"))) == len(points)
        read = sum(kb for path, kb in mapped_kb(folder).items() if not WARM.search(path))
        assert release(folder) > 0
        after = mapped_kb(folder)
        assert sum(kb for path, kb in after.items() if not WARM.search(path)) < read
        assert {path: after.get(path, 0) for path in vectors} == vectors
    finally:
        store.close()


SERVER_WITH_A_BUILD = """
import os, subprocess, sys
from memrl_mcp.storage.edge_index import ShardParams
# The build's child, its stdin a pipe whose write end a second process keeps open, as a child busy indexing never
# reads its stdin again: only its parent's death can stop it.
read, write = os.pipe()
params = ShardParams(384, False, False, True, 10_000, (("namespace", "keyword"),)).to_json()
child = subprocess.Popen([sys.executable, "-m", "memrl_mcp.storage.edge_index", sys.argv[1], params], stdin=read)
keeper = subprocess.Popen(["sleep", "600"], pass_fds=(write,), start_new_session=True)
print(child.pid, keeper.pid, flush=True)
child.wait()
"""


@pytest.mark.slow  # kills a server process
def test_a_build_child_dies_with_its_server(tmp_path: Path) -> None:
    """A server killed (SIGKILL) during a build takes its child with it: left alive, the child went on writing
    into the folder that the restarted server removes as a stray, and the restart failed ("Directory not empty")."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_WITH_A_BUILD, str(tmp_path / "memories-1")], stdout=subprocess.PIPE, env=env
    )
    assert server.stdout is not None
    child, keeper = (int(pid) for pid in server.stdout.readline().split())
    try:
        for _ in range(600):  # until the child waits for its first page: it has started, as a build's child has
            if "pipe" in Path(f"/proc/{child}/wchan").read_text():
                break
            threading.Event().wait(0.1)
        server.kill()
        server.wait()
        for _ in range(600):  # the kernel's signal, delivered at once; 60 s of patience before failing
            if not alive(child):
                break
            threading.Event().wait(0.1)
        assert not alive(child)
    finally:
        for pid in (child, keeper):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
