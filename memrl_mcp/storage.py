"""Qdrant adapters: four tables of points with a vector and a JSON payload.

- ``memories`` and ``recalls``: the episode memory (MemRL), cosine over task embeddings;
- ``steps``: the step memory (Rememberer), one record per (namespace, task, observation), whose vector is the
  task's and the observation's unit embeddings side by side, searched by dot product: a query
  ``[(1 - w) g, w o]`` then scores ``(1 - w) cos(g, g') + w cos(o, o')``, the weighted match of both parts in one
  search, with the weight chosen per query (nothing stored depends on it);
- ``episodes``: the once-only ledger of reported trajectories, keyed by episode id (a 1-d placeholder vector).

The memory service needs only the few primitives of :class:`Store`. Two engines implement them:

- :class:`EdgeStore`: qdrant-edge, Qdrant's Rust engine in process (the embedded default);
- :class:`QdrantClientStore`: qdrant-client, against a Qdrant server or its own local mode.

Both keep the utility ``q`` and the bookkeeping in the payload; the fields that searches, counts and purges filter
on are indexed (:data:`INDEXES`), each table only its own: every index costs RAM, and on tmpfs several MB of disk.
A recall is stored as a point whose vector is the query embedding, so reporting it can store the new experience
without embedding the task again.

Every open creates the payload indexes a table lacks: a process killed during the first open of a fresh store
(between creating a table and indexing it) would otherwise leave it unindexed for good.

Embedded stores refuse writes before their disk is too full for the engine (:class:`DiskRoom`): qdrant-edge
writes through memory-mapped files, and a page it cannot allocate kills the process with SIGBUS instead of an
error. Deletes are always allowed (they free room); reads never need room. An open that could run out of room is
tried in a child process first (:meth:`DiskRoom.check_open`).

Layers over a store (:class:`StoreLayer`): :class:`~memrl_mcp.quota.MeteredStore` counts each namespace's bytes
for its storage quota and has tables whose deleted points hold too much disk compacted (:meth:`EdgeStore.compact`);
:class:`ReadOnlyStore` refuses every write, and gives an embedded engine a private copy of the store to open.

:meth:`Store.set_payload_if` is the one primitive for writers that share a store (threads, or replicas on one
Qdrant server): a write applied only while the point still matches a condition. Qdrant applies the update
operations of a shard one after another, so the condition and the write cannot be split by another writer;
qdrant-client's local mode is plain Python, so this adapter makes each of its calls atomic with a lock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from memrl_mcp.edge_index import RESCORE_OVERSAMPLING, ShardParams, payload_schema, shard_config
from memrl_mcp.errors import MemrlError
from memrl_mcp.files import allocated_bytes, copy_sparse, free_bytes, hole_bytes, sync_folder, write_atomically
from memrl_mcp.numbers import kept
from memrl_mcp.settings import Settings
from memrl_mcp.tally import FIELDS as TALLY_FIELDS
from memrl_mcp.tally import Counts, Tally

Table = Literal["memories", "recalls", "steps", "episodes"]


@dataclass(frozen=True)
class Range:
    """A numeric field within bounds (each optional, inclusive ``gte``/``lte`` or strict ``gt``/``lt``)."""

    gte: float | None = None
    gt: float | None = None
    lte: float | None = None
    lt: float | None = None

    def __and__(self, other: Range) -> Range:
        """Values within both ranges."""
        return Range(
            gte=_tighter(max, self.gte, other.gte),
            gt=_tighter(max, self.gt, other.gt),
            lte=_tighter(min, self.lte, other.lte),
            lt=_tighter(min, self.lt, other.lt),
        )


def _tighter(pick: Callable[[float, float], float], a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else pick(a, b)


@dataclass(frozen=True)
class Words:
    """Full-text match: every word of ``text`` is a word of the field, in any order, case-insensitive (Qdrant's
    default word tokenizer, with a text index or without one, in every engine)."""

    text: str


Condition = str | int | Sequence[str] | Range | Words | None
Where = Mapping[str | tuple[str, ...], Condition]
"""Conditions on payload fields, all of which must hold: an exact value, a list of accepted values, a
:class:`Range`, :class:`Words`, or None: the field is absent (what a schema migration looks for). A tuple of fields
as the key: the condition holds on any one of them."""
TABLES: tuple[Table, ...] = ("memories", "recalls", "steps", "episodes")
EXPIRY = "expires_at"  # float: when a recall may be purged
IndexKind = Literal["keyword", "float", "integer", "text"]
INDEXES: dict[Table, dict[str, IndexKind]] = {
    # q, visits and updated_at: the sort keys of list_memories (order_by needs a range index); task and
    # experience: its full-text filter.
    "memories": {
        "namespace": "keyword",
        "outcome": "keyword",
        "q": "float",
        "visits": "integer",
        "updated_at": "float",
        "task": "text",
        "experience": "text",
    },
    "recalls": {"namespace": "keyword", "status": "keyword", EXPIRY: "float"},
    # nearest: the record capacity's ordered look-up of the closest pair; nearest_weight: counting the records whose
    # nearest is out of date (an unindexed count read every record's payload: 5.4 ms at 2,000, 0.3 ms indexed).
    "steps": {"namespace": "keyword", "nearest": "float", "nearest_weight": "float"},
    "episodes": {"namespace": "keyword", "status": "keyword"},
}
PLACEHOLDER = np.ones(1, dtype=np.float32)  # the vector of an episode record: it is only ever looked up by id


def vector_size(table: Table, dim: int) -> int:
    """The vector size of a table for an embedder of ``dim`` dimensions."""
    return {"steps": 2 * dim, "episodes": 1}.get(table, dim)


def is_dot(table: Table) -> bool:
    """Steps and episodes are scored by dot product (module docstring); memories and recalls by cosine."""
    return table in ("steps", "episodes")


LARGE_FIELDS = ("history", "applied")
"""Payload fields a search never needs (the Q history, the optimistic bookkeeping: up to 64 operation ids, converted
per hit): left out of its results."""
SCROLL_PAGE = 1000
MB = 1 << 20
log = logging.getLogger(__name__)

# The embedded engine's HNSW index (EdgeStore)
CURRENT = "memories.current"  # names the memories' generation folder in use
TALLY = "memories.tally.json"  # the counts of memory_stats, saved at a clean close
# Rebuild once the memories outside the index (new ones: payload updates stay in it) reach this share of the indexed
# ones: at 1M, 20,000 searched exactly, ~3 ms (benchmarks/scale.py, settings.index_min_memories).
REBUILD_SHARE = 0.02
FULL_SCAN_KB = 10_000  # Qdrant's default: a filter matching fewer vectors than this (6,500 at 384-d) is scanned
# Memories streamed to the builder per page. A page holds the GIL while it is read and pickled (1,000 points with
# vectors: ~15 ms to read), and the stream gets the GIL between two searches: at 1M unindexed memories, where an
# exact search holds it for 90-270 ms, a stream in pages of 256 crawled (the child had grown by 113 MB after 8 min).
BUILD_PAGE = 1024
FINAL_REPLAY = 64  # logged writes few enough to replay with writers held back
CHECK_EVERY = 1000  # memories writes between two checks of whether a build is due
# Writes to a table between two flushes. qdrant-edge writes a changed point's whole payload anew, and frees the old
# copy and truncates its write-ahead log only at a flush, which it never runs by itself: a server running for days
# kept every payload it had replaced since it started (issue 22). At most this many replaced payloads wait.
FLUSH_EVERY = 1000


class StoreLockedError(MemrlError):
    """The embedded store's folder is held by another process."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(
            f"the memory store at {path} is already open in another process ({detail}). An embedded store "
            "serves one process: share one memory by running a single `memrl-mcp --transport streamable-http` "
            "server and pointing every client at it, or use a Qdrant server (MEMRL_QDRANT_URL), "
            "or give this process its own MEMRL_DATA_DIR."
        )


class StoreNotWritableError(MemrlError):
    """A writable server was given a store it cannot write (a read-only volume)."""


class StoreMissingError(MemrlError):
    """A read-only server found no store to read."""


class DiskFullError(MemrlError):
    """A write was refused: the disk under the embedded store has less free space than ``min_free_disk_mb``."""


class DiskRoom:
    """The free space a write needs under an embedded store's folder, checked before each write.

    One ``statvfs`` per write (3.5 us measured, against 100 us and more for the write itself) keeps the check
    exact without a cache that a burst of writes could outrun. A new recall may use half of the margin that new
    memories and updates may not: recall keeps answering on a nearly full disk, and the other half stays for the
    engine's own growth (WAL pages, a reopen)."""

    def __init__(self, path: Path, min_free_mb: int) -> None:
        self._path = path
        self._min_free = min_free_mb * MB

    @property
    def min_free(self) -> int:
        """The margin, in bytes."""
        return self._min_free

    def check(self, share: float = 1.0) -> None:
        """Raise :class:`DiskFullError` unless ``share`` of the margin is still free."""
        if self._min_free == 0:
            return
        free = free_bytes(self._path)
        if free < self._min_free * share:
            raise DiskFullError(
                f"the disk holding the memory store ({self._path}) has {free / MB:.1f} MB free, below "
                f"min_free_disk_mb={self._min_free // MB}: writes are refused until space is freed (recall, "
                "stats and export still work; forgetting memories is allowed)"
            )

    def check_open(self, folders: Sequence[Path]) -> None:
        """Before this process opens the shards in ``folders``: make sure opening them cannot kill it.

        qdrant-edge maps its files into memory, and on tmpfs it allocates their holes as it opens them (a small
        store's first reopen grew it from 30 to 178 MB); a page it cannot allocate kills the process with SIGBUS,
        where no error can be caught. When the free space could not cover every hole of the store's files plus
        the margin, a child process opens the shards first: if it dies of SIGBUS, the disk is too full and this
        is said; if it lives, what it allocated stays allocated and this process's open needs no more."""
        free = free_bytes(self._path)
        if free >= sum(hole_bytes(folder) for folder in folders) + self._min_free:
            return
        probe = "import sys, qdrant_edge as e\nfor p in sys.argv[1:]: e.EdgeShard.load(p).close()"
        done = subprocess.run(
            [sys.executable, "-c", probe, *map(str, folders)], stdin=subprocess.DEVNULL, capture_output=True
        )
        if done.returncode == -signal.SIGBUS:
            raise DiskFullError(
                f"cannot open the memory store at {self._path}: its disk has {free / MB:.1f} MB free, too little "
                "for the engine to map its files (a process opening it died of SIGBUS). Free some space; "
                "meanwhile a read-only server (MEMRL_READ_ONLY=true) serves it and `memrl-mcp export` backs it "
                "up: both open a copy of it in TMPDIR"
            )
        # Any other failure (a lock held, no space for a file the engine writes) is met and named by our own open.


RECALL_SHARE = 0.5  # of the free-space margin, that a new recall may use


@dataclass(frozen=True)
class Point:
    """A point to write: id, vector, payload (its floats made ones the engines keep: :mod:`memrl_mcp.numbers`)."""

    id: str
    vector: np.ndarray
    payload: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "payload", kept(self.payload))


@dataclass(frozen=True)
class Hit:
    """A search result: point id, similarity (cosine; for steps the weighted dot product), payload, and the
    vector when it was asked for."""

    id: str
    similarity: float
    payload: dict[str, Any]
    vector: np.ndarray | None = None


class Store(Protocol):
    """What the memory service needs from a vector store."""

    def upsert(self, table: Table, points: Sequence[Point]) -> None: ...

    def insert(self, table: Table, point: Point) -> None:
        """Write ``point`` only if no point has its id (atomically): of racing creators, the first wins and the
        others change nothing; read it back to learn which."""
        ...

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """The points of ``ids`` that exist, with only ``fields`` of their payload (None: all of it)."""
        ...

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None: ...

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None: ...

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> None:
        """Set ``payload`` only if the point still matches ``where``, atomically; read the point back to learn
        whether it did (Qdrant does not say)."""
        ...

    def delete(self, table: Table, ids: Sequence[str]) -> None: ...

    def delete_namespace(self, table: Table, namespace: str) -> None: ...

    def purge_recalls(self, expired_before: float) -> None: ...

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        """The nearest points of ``table``, their payloads without :data:`LARGE_FIELDS`."""
        ...

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        """Up to ``limit`` points in id order from ``offset`` (included), payloads without :data:`LARGE_FIELDS`;
        and the id the next page starts at (None: no more)."""
        ...

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """The first ``limit`` points by the value of ``key`` (an indexed number), payloads without
        :data:`LARGE_FIELDS`; the order of equal values is the engine's, unspecified."""
        ...

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every point matching ``where``, with only ``fields`` of its payload (None: all of it)."""
        ...

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        """Every point matching ``where`` with its vector and only ``fields`` of its payload."""
        ...

    def count(self, table: Table, where: Where | None = None) -> int: ...

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        """The memories' counts for ``memory_stats``, of ``namespaces`` (None: all)."""
        ...

    def usage(self, namespace: str) -> int | None:
        """Bytes the namespace's records take (:mod:`memrl_mcp.quota`); None where they are not measured."""
        ...

    def compact(self, table: Table) -> None:
        """Give back the disk space of the table's deleted points (in the background), where the engine can."""
        ...

    def close(self) -> None: ...


class EdgeStore:
    """Embedded Qdrant (qdrant-edge): one shard folder per table under ``path``.

    A table's shard can be rebuilt while this process keeps serving: its points are streamed to a child process
    (:mod:`memrl_mcp.edge_index`) that writes them into a new generation folder ``<table>-<n>``, named by the file
    ``<table>.current`` (replaced atomically, so a crash leaves either the old complete generation or the new one;
    stray folders are removed at the next open). While the child builds, every write to the table is logged, and
    replayed on the new shard before the swap: the stream the child read was read while writes went on, but each
    logged write is an upsert, a delete, or a write conditional on a state it changes (a ``version`` it advances,
    a status it leaves), so replaying it on a state that already has it changes nothing. Readers hold the shard
    they started with until they finish; the old one is closed after the last, and its folder removed. One rebuild
    runs at a time; others wait their turn (:meth:`compact`, :meth:`build_index`).

    A rebuild serves two ends. Memories are searched exactly until ``index_min`` of them are not in an HNSW index;
    then the memories are rebuilt with one. Points written after that land in an appendable segment of the new
    shard, searched exactly; the index is rebuilt when that part reaches ``max(index_min, REBUILD_SHARE x the
    indexed ones)``: each rebuild reads every memory, so spacing rebuilds in proportion to the store keeps their
    cost per write constant. And a table whose deleted points hold too much disk is compacted (:meth:`compact`):
    qdrant-edge only marks deleted points, and a new generation holds the live ones only.

    The counts of ``memory_stats`` are kept up to date write by write (:class:`Tally`: the writes are this
    process's alone, the store being locked), saved at close and read back at open; a store not closed cleanly is
    counted again at open.

    The recalls table keeps its vectors and payload in memory-mapped files (``Memory.Cold``): a pending recall
    is read once, when it is reported, so its bytes need not stay resident (a restarted server holding 50,000
    pending recalls: 164 MB resident instead of 272, benchmarks/recall_rss.py)."""

    def __init__(
        self, path: Path, dim: int, room: DiskRoom | None = None, index_min: int = 0, hnsw_ef: int = 128
    ) -> None:
        import qdrant_edge as edge

        self._edge = edge
        path.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._dim = dim
        self._room = room or DiskRoom(path, 0)
        self._index_min = index_min
        self._hnsw_ef = hnsw_ef
        self._rescore = edge.QuantizationSearchParams(rescore=True, oversampling=RESCORE_OVERSAMPLING)
        self._originals = edge.QuantizationSearchParams(ignore=True)  # exact: every score from the original vector
        self._generations = threading.Condition()  # guards the shards in use and their readers
        self._writing = threading.Lock()  # one write at a time: the tally and the replay log follow them
        self._jobs: list[_Rebuild] = []  # rebuilds to run, the first one running
        self._log: list[Any] | None = None  # writes to the table being rebuilt since its stream started
        self._builder: threading.Thread | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._closing = False
        self._writes_to_check = 0
        self._unflushed: dict[Table, int] = dict.fromkeys(TABLES, 0)
        self.last_build: BuildTimes | None = None
        names = {table: self._current_generation(table) for table in TABLES}
        self._room.check_open([path / name for name in names.values() if (path / name / "edge_config.json").exists()])
        self._live = {table: _Live(self._open(path / name, dim, table), name) for table, name in names.items()}
        for table, name in names.items():
            for stray in path.glob(f"{table}*"):  # a rebuild or a retired generation a crash left behind
                if stray.is_dir() and stray.name != name:
                    shutil.rmtree(stray)
        self._tally = self._read_tally()
        self._maybe_build()

    # -- generations ------------------------------------------------------------------------------

    def _current_generation(self, table: Table) -> str:
        pointer = self._path / f"{table}.current"
        return pointer.read_text().strip() if pointer.exists() else table

    def _params(self, table: Table, hnsw: bool) -> ShardParams:
        size = vector_size(table, self._dim)
        indexes = tuple(INDEXES[table].items())
        return ShardParams(size, is_dot(table), table == "recalls", hnsw, FULL_SCAN_KB, indexes, self._room.min_free)

    def _open(self, path: Path, dim: int, table: Table) -> Any:
        edge = self._edge
        config_file = path / "edge_config.json"
        stored = json.loads(config_file.read_text()) if config_file.exists() else None
        if stored is not None:
            stored_dim = int(next(iter(stored["vectors"].values()))["size"])
            if stored_dim != vector_size(table, dim):
                raise ValueError(
                    f"the store at {path} holds {stored_dim}-d vectors; the embedder makes {dim}-d ones "
                    f"({vector_size(table, dim)}-d in this table)"
                )
        config = shard_config(edge, self._params(table, hnsw=False))
        try:
            if stored is None:
                shard = edge.EdgeShard.create(str(path), config)
            elif table == "recalls" and stored.get("payload_memory") != "cold":
                # A store made before recalls were memory-mapped: loading with a config rewrites it (that needs
                # a little room, so it is done only when something changes).
                shard = edge.EdgeShard.load(str(path), config)
            else:
                shard = edge.EdgeShard.load(str(path))
        except Exception as error:
            if "WouldBlock" in str(error):
                raise StoreLockedError(path, "its write-ahead log is locked") from None
            if "No space left on device" in str(error):  # the engine writes a little at every open
                raise DiskFullError(
                    f"cannot open the memory store at {path}: its disk is full. Free some space; meanwhile a "
                    "read-only server (MEMRL_READ_ONLY=true) serves it and `memrl-mcp export` backs it up: both "
                    "open a copy of it in TMPDIR"
                ) from None
            raise
        indexed = set(shard.info().payload_schema)
        for key, kind in INDEXES[table].items():
            if key not in indexed:
                shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
        return shard

    @contextmanager
    def _reading(self, table: Table) -> Iterator[Any]:
        """The table's shard in use now, kept open until the block ends (a swap waits for it)."""
        with self._generations:
            live = self._live[table]
            live.readers += 1
        try:
            yield live.shard
        finally:
            with self._generations:
                live.readers -= 1
                self._generations.notify_all()

    def index_status(self) -> tuple[int, int]:
        """(memories, of which in an HNSW index)."""
        with self._reading("memories") as shard:
            info = shard.info()
        return int(info.points_count), int(info.indexed_vectors_count)

    def _maybe_build(self) -> None:
        """Index the memories when those searched exactly have outgrown the bound (see the class)."""
        if self._index_min <= 0 or self._closing or any(job.table == "memories" for job in self._jobs):
            return
        points, indexed = self.index_status()
        if points - indexed >= max(self._index_min, REBUILD_SHARE * indexed):
            self.build_index()

    def build_index(self, wait: bool = False) -> None:
        """Rebuild the memories with an HNSW index in the background (now, whatever their number); ``wait``:
        return once it is in use (tests, benchmarks)."""
        self._rebuild("memories", hnsw=True, wait=wait)

    def compact(self, table: Table, wait: bool = False) -> None:
        """Rebuild ``table`` in the background with its live points only, giving back the disk its deleted ones
        hold; the memories keep an HNSW index once ``index_min`` of them are stored. ``wait``: return once the
        new generation is in use."""
        hnsw = table == "memories" and 0 < self._index_min <= self.index_status()[0]
        self._rebuild(table, hnsw, wait)

    def _rebuild(self, table: Table, hnsw: bool, wait: bool) -> None:
        """Queue a rebuild, unless the same one is queued already and not started: it will see every write."""
        with self._writing:
            if self._closing:
                return
            job = next((j for j in self._jobs[1:] if (j.table, j.hnsw) == (table, hnsw)), None)
            if job is None:
                job = _Rebuild(table, hnsw)
                self._jobs.append(job)
            if self._builder is None:
                self._builder = threading.Thread(target=self._build, name="memrl-rebuild", daemon=True)
                self._builder.start()
        if wait:
            job.done.wait()

    def _build(self) -> None:
        """Run the rebuilds queued, one after another, until none is left or the store closes."""
        while True:
            with self._writing:
                if not self._jobs or self._closing:
                    self._builder = None
                    for job in self._jobs:
                        job.done.set()
                    self._jobs.clear()
                    return
                job = self._jobs[0]
                self._log = []
            target = self._path / f"{job.table}-{time.time_ns()}"
            times = BuildTimes()
            try:
                new = self._build_shard(job, target, times)
                if new is not None and self._swap(job.table, new, times):
                    self.last_build = times
                    log.info("%s rebuilt%s: %s", job.table, " with an HNSW index" if job.hnsw else "", times)
            except Exception:
                if not self._closing:  # else: the child was killed by close()
                    log.exception("rebuilding the %s table failed; it stays as it was", job.table)
                shutil.rmtree(target, ignore_errors=True)
                if job.hnsw:
                    self._index_min = 0  # no retry in this process: searches stay exact until the next open
            finally:
                with self._writing:
                    self._log = None
                    self._child = None
                    self._jobs.remove(job)
                job.done.set()

    def _build_shard(self, job: _Rebuild, target: Path, times: BuildTimes) -> _Live | None:
        """Stream every point of the table to the child, wait for its shard; None if the store closed meanwhile."""
        start = time.perf_counter()
        params = self._params(job.table, job.hnsw).to_json()
        with tempfile.TemporaryFile() as errors:  # not a pipe: nobody reads it until the child is done
            child = subprocess.Popen(
                [sys.executable, "-m", "memrl_mcp.edge_index", str(target), params],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
            self._child = child
            assert child.stdin is not None
            with child.stdin, self._reading(job.table) as shard:
                offset = None
                while not self._closing:
                    request = self._edge.ScrollRequest(
                        offset=offset, limit=BUILD_PAGE, with_payload=True, with_vector=True
                    )
                    records, offset = shard.scroll(request)
                    pickle.dump([(str(r.id), r.vector, r.payload) for r in records], child.stdin)
                    times.points += len(records)
                    if offset is None:
                        pickle.dump(None, child.stdin)
                        break
            times.stream_s = time.perf_counter() - start
            child.wait()
            times.index_s = time.perf_counter() - start - times.stream_s
            if self._closing:
                shutil.rmtree(target, ignore_errors=True)
                return None
            if child.returncode != 0:
                errors.seek(0)
                detail = errors.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"the rebuild exited with status {child.returncode}: {detail}")
        start = time.perf_counter()
        self._room.check_open([target])
        new = _Live(self._edge.EdgeShard.load(str(target)), target.name)
        times.load_s = time.perf_counter() - start
        return new

    def _swap(self, table: Table, new: _Live, times: BuildTimes) -> bool:
        """Replay the writes logged during the rebuild on ``new``, in rounds until one is short enough to finish
        with writers held back, then make ``new`` current (on disk first) and retire the old shard. False if the
        store closed meanwhile."""
        while True:
            with self._writing:
                assert self._log is not None
                replay, self._log = self._log, []
                times.replayed += len(replay)
                if len(replay) <= FINAL_REPLAY or self._closing:
                    held = time.perf_counter()
                    for operation in replay:
                        new.shard.update(operation)
                    if self._closing:
                        new.shard.close()
                        shutil.rmtree(self._path / new.name, ignore_errors=True)
                        return False
                    new.shard.flush()
                    pointer = self._path / f"{table}.current"
                    write_atomically(pointer, lambda stream: stream.write(new.name.encode()))
                    with self._generations:
                        old, self._live[table] = self._live[table], new
                    times.held_s = time.perf_counter() - held
                    break
            for operation in replay:
                new.shard.update(operation)
        with self._generations:
            self._generations.wait_for(lambda: old.readers == 0)
        old.shard.close()
        shutil.rmtree(self._path / old.name, ignore_errors=True)
        return True

    # -- the counts of memory_stats ----------------------------------------------------------------

    def _read_tally(self) -> Tally:
        """The counts saved at the last clean close (the file is removed at once: a crash must not find it), else a
        full count."""
        saved = self._path / TALLY
        if saved.exists():
            text = saved.read_text()
            saved.unlink()
            sync_folder(self._path)
            saved_tally = json.loads(text)
            if saved_tally.get("generation") == self._live["memories"].name:
                return Tally.from_dict(saved_tally["namespaces"])
        return Tally.of(payload for _, payload in self.scroll("memories", fields=TALLY_FIELDS))

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        with self._writing:
            return self._tally.total(namespaces)

    def _fields(self, shard: Any, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        selector = self._edge.PayloadSelector.Include(list(TALLY_FIELDS))
        return {str(r.id): dict(r.payload or {}) for r in shard.retrieve(list(ids), selector, False)} if ids else {}

    def _write(
        self,
        table: Table,
        operation: Any,
        room: float | None,
        ids: Sequence[str] | None = None,
        new: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Apply one write under the lock that orders them: check the free space it needs (``room``: the share of
        the margin; None: a delete, always let through since it frees room), count its effect on the memories'
        tally (on ``ids``, None: every point it may touch, read first; ``new``: their payloads, when known), log it
        for a rebuild of its table in flight, and start an index build of the memories when one is due."""
        memories = table == "memories"
        with self._writing, self._reading(table) as shard:
            if room is not None:
                self._room.check(room)
            if memories:
                ids = [point_id for point_id, _ in self.scroll("memories", fields=())] if ids is None else ids
                old = self._fields(shard, ids)
            shard.update(operation)
            self._flush_when_due(table, shard)
            if memories:
                after = new if new is not None else self._fields(shard, ids)
                for point_id in set(old) | set(after):
                    self._tally.apply(old.get(point_id), after.get(point_id))
                self._writes_to_check -= 1
            if self._log is not None and self._jobs[0].table == table:
                self._log.append(operation)
        if memories and self._writes_to_check <= 0:
            self._writes_to_check = CHECK_EVERY
            self._maybe_build()

    # -- the Store primitives ------------------------------------------------------------------------

    def _filter(self, where: Where | None, point_id: str | None = None) -> Any:
        edge = self._edge
        must: list[Any] = []
        for key, value in (where or {}).items():
            if isinstance(key, tuple):
                must.append(edge.Filter(should=[self._condition(field, value) for field in key]))
            else:
                must.append(self._condition(key, value))
        if point_id is not None:
            must.append(edge.HasIdCondition({point_id}))
        return edge.Filter(must=must) if must else None

    def _condition(self, key: str, value: Condition) -> Any:
        edge = self._edge
        if value is None:
            return edge.IsEmptyCondition(key)
        if isinstance(value, Range):
            return edge.FieldCondition(
                key, range=edge.RangeFloat(gte=value.gte, gt=value.gt, lte=value.lte, lt=value.lt)
            )
        if isinstance(value, Words):
            return edge.FieldCondition(key, match=edge.MatchText(value.text))
        if isinstance(value, list | tuple | set | frozenset):
            return edge.FieldCondition(key, match=edge.MatchAny(list(value)))
        return edge.FieldCondition(key, match=edge.MatchValue(value))

    def _flush_when_due(self, table: Table, shard: Any) -> None:
        """Flush a table at every :data:`FLUSH_EVERY`-th write to it in this process (its only writer)."""
        self._unflushed[table] += 1
        if self._unflushed[table] >= FLUSH_EVERY:
            self._unflushed[table] = 0
            shard.flush()

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        batch = [self._edge.Point(p.id, p.vector.astype(np.float32).tolist(), p.payload) for p in points]
        operation = self._edge.UpdateOperation.upsert_points(batch)
        room = RECALL_SHARE if table == "recalls" else 1.0
        self._write(table, operation, room, [p.id for p in points], {p.id: p.payload for p in points})

    def insert(self, table: Table, point: Point) -> None:
        batch = [self._edge.Point(point.id, point.vector.astype(np.float32).tolist(), point.payload)]
        operation = self._edge.UpdateOperation.upsert_points(batch, update_mode=self._edge.UpdateMode.InsertOnly)
        self._write(table, operation, 1.0, [point.id])

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        payload = True if fields is None else self._edge.PayloadSelector.Include(list(fields))
        with self._reading(table) as shard:
            records = shard.retrieve(list(ids), payload, False)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        with self._reading(table) as shard:
            records = shard.retrieve([point_id], False, True)
        return np.asarray(records[0].vector, dtype=np.float32) if records else None

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        self._write(table, self._edge.UpdateOperation.set_payload([point_id], kept(payload)), 1.0, [point_id])

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> None:
        operation = self._edge.UpdateOperation.set_payload_by_filter(self._filter(where, point_id), kept(payload))
        self._write(table, operation, 1.0, [point_id])

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        if ids:
            self._write(table, self._edge.UpdateOperation.delete_points(list(ids)), None, ids)

    def delete_namespace(self, table: Table, namespace: str) -> None:
        where = {"namespace": namespace}
        operation = self._edge.UpdateOperation.delete_points_by_filter(self._filter(where))
        ids = [point_id for point_id, _ in self.scroll(table, where, ())] if table == "memories" else None
        self._write(table, operation, None, ids)

    def purge_recalls(self, expired_before: float) -> None:
        edge = self._edge
        expired = edge.Filter(must=[edge.FieldCondition(EXPIRY, range=edge.RangeFloat(lt=expired_before))])
        self._write("recalls", edge.UpdateOperation.delete_points_by_filter(expired), None)

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
        *,
        exact: bool = False,
        hnsw_ef: int | None = None,
    ) -> list[Hit]:
        """``exact``: score every candidate with its original vector, ignoring the index and the int8 copies;
        ``hnsw_ef``: instead of the store's (benchmarks)."""
        edge = self._edge
        request = edge.QueryRequest(
            limit=limit,
            query=edge.Query.Nearest(vector.astype(np.float32).tolist()),
            filter=self._filter(where),
            score_threshold=min_similarity,
            with_payload=edge.PayloadSelector.Exclude(list(LARGE_FIELDS)),
            with_vector=with_vectors,
            params=edge.SearchParams(
                exact=exact, hnsw_ef=hnsw_ef or self._hnsw_ef, quantization=self._originals if exact else self._rescore
            ),
        )
        with self._reading(table) as shard:
            points = shard.query(request)
        return [Hit(str(p.id), float(p.score), dict(p.payload or {}), _array(p.vector)) for p in points]

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        offset = None
        with self._reading(table) as shard:
            while True:
                request = self._edge.ScrollRequest(
                    offset=offset,
                    limit=SCROLL_PAGE,
                    filter=self._filter(where),
                    with_payload=self._edge.PayloadSelector.Include(list(fields)),
                    with_vector=True,
                )
                records, offset = shard.scroll(request)
                yield from ((str(r.id), np.asarray(r.vector, dtype=np.float32), dict(r.payload or {})) for r in records)
                if offset is None:
                    return

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        request = self._edge.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=self._filter(where),
            with_payload=self._edge.PayloadSelector.Exclude(list(LARGE_FIELDS)),
        )
        with self._reading(table) as shard:
            records, next_offset = shard.scroll(request)
        return [(str(r.id), dict(r.payload or {})) for r in records], None if next_offset is None else str(next_offset)

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        edge = self._edge
        request = edge.ScrollRequest(
            limit=limit,
            filter=self._filter(where),
            with_payload=edge.PayloadSelector.Exclude(list(LARGE_FIELDS)),
            order_by=edge.OrderBy(key, edge.Direction.Desc if descending else edge.Direction.Asc),
        )
        with self._reading(table) as shard:
            records, _ = shard.scroll(request)
        return [(str(r.id), dict(r.payload or {})) for r in records]

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        payload = True if fields is None else self._edge.PayloadSelector.Include(list(fields))
        offset = None
        with self._reading(table) as shard:
            while True:
                request = self._edge.ScrollRequest(
                    offset=offset, limit=SCROLL_PAGE, filter=self._filter(where), with_payload=payload
                )
                records, offset = shard.scroll(request)
                yield from ((str(r.id), dict(r.payload or {})) for r in records)
                if offset is None:
                    return

    def count(self, table: Table, where: Where | None = None) -> int:
        request = self._edge.CountRequest(exact=True, filter=self._filter(where))
        with self._reading(table) as shard:
            return int(shard.count(request))

    def usage(self, namespace: str) -> int | None:
        return None  # measured by the layer over it (memrl_mcp.quota.MeteredStore)

    def close(self) -> None:
        """Stop a build in flight (its child is killed, its folder removed), then flush, close and save the
        counts."""
        with self._writing:
            self._closing = True
            builder, child = self._builder, self._child
        if child is not None:
            child.kill()
        if builder is not None:
            builder.join()
        with self._writing:
            generation = self._live["memories"].name
            for live in self._live.values():
                live.shard.flush()
                live.shard.close()
            saved = json.dumps({"generation": generation, "namespaces": self._tally.to_dict()}).encode()
            try:
                write_atomically(self._path / TALLY, lambda stream: stream.write(saved))
            except OSError as error:  # a full disk: the next open counts the memories again
                log.warning("could not save the memories' counts (%s); the next open recounts them", error)


@dataclass
class BuildTimes:
    """Where a rebuild's time went: streaming the table's points to the child (the server's share, interleaved
    with its requests), the child's writing and indexing after that, opening the new shard (holds the GIL), and
    the last replay round with writers held back."""

    points: int = 0
    stream_s: float = 0.0
    index_s: float = 0.0
    load_s: float = 0.0
    replayed: int = 0
    held_s: float = 0.0


@dataclass(frozen=True)
class _Rebuild:
    """A rebuild of a table waiting or running; ``done`` is set once it is over (swapped in, failed or dropped)."""

    table: Table
    hnsw: bool
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Live:
    """A table's open shard, its generation folder's name and the readers inside it."""

    shard: Any
    name: str = ""
    readers: int = 0


def _array(vector: Any) -> np.ndarray | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32)


class QdrantClientStore:
    """qdrant-client: a Qdrant server (``url``) or qdrant-client's local mode (``path``)."""

    def __init__(
        self,
        dim: int,
        collection: str,
        *,
        url: str | None = None,
        api_key: str | None = None,
        path: Path | None = None,
        room: DiskRoom | None = None,
        create: bool = True,
    ) -> None:
        """``create``: create the collections and payload indexes a store lacks (not for a read-only server)."""
        from qdrant_client import QdrantClient, models

        self._models = models
        self._room = room
        self._names = {table: f"{collection}_{table}" for table in TABLES}
        self._client_is_local = url is None
        # On a cluster a conditional write is trusted only once read back, so writes are acknowledged after every
        # replica of the shard applied them in the leader's order, and reads consult a majority of replicas: a
        # read-back then sees the write it follows (README, "Replicas on one Qdrant server").
        self._write: dict[str, Any] = {"wait": True, "ordering": models.WriteOrdering.STRONG}
        self._read: dict[str, Any] = {"consistency": models.ReadConsistencyType.MAJORITY}
        self._without_large_fields = models.PayloadSelectorExclude(exclude=list(LARGE_FIELDS))
        # A Qdrant server applies each update atomically; local mode is Python over numpy: one call at a time.
        self._atomic: AbstractContextManager[Any] = threading.Lock() if url is None else nullcontext()
        if url is not None:
            self._client = QdrantClient(url=url, api_key=api_key)
        elif path is not None:
            path.mkdir(parents=True, exist_ok=True)
            try:
                self._client = QdrantClient(path=str(path))
            except RuntimeError as error:
                if "already accessed" in str(error):
                    raise StoreLockedError(path, "qdrant-client's local storage is locked") from None
                raise
        else:
            raise ValueError("QdrantClientStore needs a url or a path")
        for table in TABLES:
            self._ensure_collection(table, dim, create)

    def _ensure_collection(self, table: Table, dim: int, create: bool) -> None:
        """Create the collection if it is missing, then the payload indexes it lacks (server mode: local mode
        scans everything and warns that indexes do nothing); without ``create``, a missing collection is refused."""
        models, name = self._models, self._names[table]
        size = vector_size(table, dim)
        if not create and not self._client.collection_exists(name):
            raise StoreMissingError(f"the Qdrant server has no collection {name}, and a read-only server creates none")
        if self._client.collection_exists(name):
            stored_dim = getattr(self._client.get_collection(name).config.params.vectors, "size", None)
            if stored_dim is not None and stored_dim != size:
                raise ValueError(
                    f"collection {name} holds {stored_dim}-d vectors; the embedder makes {dim}-d ones "
                    f"({size}-d in this table)"
                )
        else:
            distance = models.Distance.DOT if is_dot(table) else models.Distance.COSINE
            vectors = models.VectorParams(size=size, distance=distance)
            self._client.create_collection(name, vectors_config=vectors)
        if self._client_is_local or not create:
            return
        indexed = set(self._client.get_collection(name).payload_schema)
        schemas = {
            "keyword": models.PayloadSchemaType.KEYWORD,
            "float": models.PayloadSchemaType.FLOAT,
            "integer": models.PayloadSchemaType.INTEGER,
            "text": models.PayloadSchemaType.TEXT,
        }
        for key, kind in INDEXES[table].items():
            if key not in indexed:
                self._client.create_payload_index(name, key, field_schema=schemas[kind], **self._write)

    def _check_room(self, share: float = 1.0) -> None:
        if self._room is not None:
            self._room.check(share)

    def _filter(self, where: Where | None, point_id: str | None = None) -> Any:
        models = self._models
        must: list[Any] = []
        for key, value in (where or {}).items():
            if isinstance(key, tuple):
                must.append(models.Filter(should=[self._condition(field, value) for field in key]))
            else:
                must.append(self._condition(key, value))
        if point_id is not None:
            must.append(models.HasIdCondition(has_id=[point_id]))
        return models.Filter(must=must) if must else None

    def _condition(self, key: str, value: Condition) -> Any:
        models = self._models
        if value is None:
            return models.IsEmptyCondition(is_empty=models.PayloadField(key=key))
        if isinstance(value, Range):
            return models.FieldCondition(
                key=key, range=models.Range(gte=value.gte, gt=value.gt, lte=value.lte, lt=value.lt)
            )
        if isinstance(value, Words):
            return models.FieldCondition(key=key, match=models.MatchText(text=value.text))
        if isinstance(value, list | tuple | set | frozenset):
            return models.FieldCondition(key=key, match=models.MatchAny(any=list(value)))
        return models.FieldCondition(key=key, match=models.MatchValue(value=value))

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        batch = [
            self._models.PointStruct(id=p.id, vector=p.vector.astype(np.float32).tolist(), payload=p.payload)
            for p in points
        ]
        self._check_room(RECALL_SHARE if table == "recalls" else 1.0)
        with self._atomic:
            self._client.upsert(self._names[table], batch, **self._write)

    def insert(self, table: Table, point: Point) -> None:
        models = self._models
        batch = [
            models.PointStruct(id=point.id, vector=point.vector.astype(np.float32).tolist(), payload=point.payload)
        ]
        self._check_room()
        with self._atomic:
            self._client.upsert(self._names[table], batch, update_mode=models.UpdateMode.INSERT_ONLY, **self._write)

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        payload = True if fields is None else list(fields)
        with self._atomic:
            records = self._client.retrieve(self._names[table], list(ids), with_payload=payload, **self._read)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        with self._atomic:
            records = self._client.retrieve(
                self._names[table], [point_id], with_payload=False, with_vectors=True, **self._read
            )
        return np.asarray(records[0].vector, dtype=np.float32) if records else None

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        self._check_room()
        with self._atomic:
            self._client.set_payload(self._names[table], payload=kept(payload), points=[point_id], **self._write)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> None:
        selector = self._models.FilterSelector(filter=self._filter(where, point_id))
        self._check_room()
        with self._atomic:
            self._client.set_payload(self._names[table], payload=kept(payload), points=selector, **self._write)

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        if ids:
            selector = self._models.PointIdsList(points=list(ids))
            with self._atomic:
                self._client.delete(self._names[table], points_selector=selector, **self._write)

    def delete_namespace(self, table: Table, namespace: str) -> None:
        selector = self._models.FilterSelector(filter=self._filter({"namespace": namespace}))
        with self._atomic:
            self._client.delete(self._names[table], points_selector=selector, **self._write)

    def purge_recalls(self, expired_before: float) -> None:
        models = self._models
        expired = models.Filter(must=[models.FieldCondition(key=EXPIRY, range=models.Range(lt=expired_before))])
        with self._atomic:
            self._client.delete(
                self._names["recalls"], points_selector=models.FilterSelector(filter=expired), **self._write
            )

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        with self._atomic:
            response = self._client.query_points(
                self._names[table],
                query=vector.astype(np.float32).tolist(),
                query_filter=self._filter(where),
                score_threshold=min_similarity,
                limit=limit,
                with_payload=self._without_large_fields,
                with_vectors=with_vectors,
                **self._read,
            )
        return [Hit(str(p.id), float(p.score), dict(p.payload or {}), _array(p.vector)) for p in response.points]

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        offset = None
        while True:
            with self._atomic:
                records, offset = self._client.scroll(
                    self._names[table],
                    scroll_filter=self._filter(where),
                    limit=SCROLL_PAGE,
                    offset=offset,
                    with_payload=list(fields),
                    with_vectors=True,
                    **self._read,
                )
            yield from ((str(r.id), np.asarray(r.vector, dtype=np.float32), dict(r.payload or {})) for r in records)
            if offset is None:
                return

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        with self._atomic:
            records, next_offset = self._client.scroll(
                self._names[table],
                scroll_filter=self._filter(where),
                limit=limit,
                offset=offset,
                with_payload=self._without_large_fields,
                **self._read,
            )
        return [(str(r.id), dict(r.payload or {})) for r in records], None if next_offset is None else str(next_offset)

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        models = self._models
        direction = models.Direction.DESC if descending else models.Direction.ASC
        with self._atomic:
            records, _ = self._client.scroll(
                self._names[table],
                scroll_filter=self._filter(where),
                limit=limit,
                order_by=models.OrderBy(key=key, direction=direction),
                with_payload=self._without_large_fields,
                **self._read,
            )
        return [(str(r.id), dict(r.payload or {})) for r in records]

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        payload = True if fields is None else list(fields)
        offset = None
        while True:
            with self._atomic:
                records, offset = self._client.scroll(
                    self._names[table],
                    scroll_filter=self._filter(where),
                    limit=SCROLL_PAGE,
                    offset=offset,
                    with_payload=payload,
                    **self._read,
                )
            yield from ((str(r.id), dict(r.payload or {})) for r in records)
            if offset is None:
                return

    def count(self, table: Table, where: Where | None = None) -> int:
        # Qdrant's count takes no read consistency; counts feed statistics and bounds, never a correctness check.
        with self._atomic:
            return int(self._client.count(self._names[table], count_filter=self._filter(where), exact=True).count)

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        """Counted by reading the memories: replicas share the collection, so no process sees every write."""
        where = None if namespaces is None else {"namespace": list(namespaces)}
        return Tally.of(payload for _, payload in self.scroll("memories", where, TALLY_FIELDS)).total()

    def usage(self, namespace: str) -> int | None:
        return None  # measured by the layer over an embedded store (memrl_mcp.quota); a server's replicas cannot

    def compact(self, table: Table) -> None:
        """Nothing to do: local mode keeps its points in SQLite, which reuses the pages of deleted points for later
        writes (it does not return them to the filesystem); a Qdrant server vacuums its own segments."""

    def close(self) -> None:
        with self._atomic:
            self._client.close()


class StoreLayer:
    """A store over another one: every primitive is handed to ``inner`` unless a subclass overrides it."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        self._inner.upsert(table, points)

    def insert(self, table: Table, point: Point) -> None:
        self._inner.insert(table, point)

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        return self._inner.get(table, ids, fields)

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        return self._inner.get_vector(table, point_id)

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        self._inner.set_payload(table, point_id, payload)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> None:
        self._inner.set_payload_if(table, point_id, payload, where)

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        self._inner.delete(table, ids)

    def delete_namespace(self, table: Table, namespace: str) -> None:
        self._inner.delete_namespace(table, namespace)

    def purge_recalls(self, expired_before: float) -> None:
        self._inner.purge_recalls(expired_before)

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        return self._inner.search(vector, limit, min_similarity, where, table, with_vectors)

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        return self._inner.scroll_from(table, where, offset, limit)

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        return self._inner.ordered(table, where, key, descending, limit)

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._inner.scroll(table, where, fields)

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        return self._inner.vectors(table, where, fields)

    def count(self, table: Table, where: Where | None = None) -> int:
        return self._inner.count(table, where)

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        return self._inner.tally(namespaces)

    def usage(self, namespace: str) -> int | None:
        return self._inner.usage(namespace)

    def compact(self, table: Table) -> None:
        self._inner.compact(table)

    def close(self) -> None:
        self._inner.close()


class ReadOnlyError(MemrlError):
    """A write reached a read-only store."""


class ReadOnlyStore(StoreLayer):
    """``read_only``: every write is refused here, under the tools that already offer none, so that no code path
    can change the store. An embedded engine writes its own files at every open (qdrant-edge rewrites its config
    and compacts its journals; it cannot open a read-only filesystem at all), so it is given a private copy of the
    store (``scratch``), removed at close: the store itself is only ever read, and may sit on a read-only volume."""

    def __init__(self, inner: Store, scratch: Path | None = None) -> None:
        super().__init__(inner)
        self._scratch = scratch

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise ReadOnlyError("the memory store is read-only (read_only: true): nothing is written")

    upsert = insert = set_payload = set_payload_if = delete = delete_namespace = purge_recalls = compact = _refuse

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)


ENGINE_FOLDERS = {"edge": "edge", "qdrant-local": "qdrant-local"}


def open_store(settings: Settings, dim: int) -> Store:
    """The store the settings ask for: a Qdrant server if a URL is set, else an embedded engine, whose usage per
    namespace is measured (:class:`~memrl_mcp.quota.MeteredStore`); read-only (:class:`ReadOnlyStore`) with
    ``read_only``."""
    if settings.qdrant_url:
        api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        server = QdrantClientStore(
            dim, settings.collection, url=settings.qdrant_url, api_key=api_key, create=not settings.read_only
        )
        return ReadOnlyStore(server) if settings.read_only else server
    folder = settings.data_dir / settings.collection / ENGINE_FOLDERS[settings.embedded_engine]
    if not settings.read_only:
        existing = next(path for path in (folder, *folder.parents) if path.exists())
        if not os.access(existing, os.W_OK):
            raise StoreNotWritableError(
                f"the memory store at {folder} cannot be written ({existing} is read-only to this process): serve "
                "it with read_only: true (MEMRL_READ_ONLY=true), which reads a copy, or move it to a writable folder"
            )
        from memrl_mcp.quota import MeteredStore  # a layer over the stores of this module

        store = _embedded(settings, folder, dim)
        try:
            return MeteredStore(store, folder, dim)
        except BaseException:
            store.close()
            raise
    scratch = private_copy(folder, settings.min_free_disk_mb)
    try:
        return ReadOnlyStore(_embedded(settings, scratch / folder.name, dim, index_min=0), scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _embedded(settings: Settings, folder: Path, dim: int, index_min: int | None = None) -> Store:
    room = DiskRoom(folder, settings.min_free_disk_mb)
    if settings.embedded_engine == "qdrant-local":
        return QdrantClientStore(dim, settings.collection, path=folder, room=room)
    index_min = settings.index_min_memories if index_min is None else index_min
    return EdgeStore(folder, dim, room, index_min, settings.hnsw_ef)


def private_copy(folder: Path, min_free_mb: int) -> Path:
    """A new temporary folder (under TMPDIR) holding a copy of the embedded store at ``folder``, made while the
    engines' own locks are held shared (qdrant-edge locks each table's ``wal`` folder, qdrant-client its
    ``.lock`` file), so that no server writes the store mid-copy; a store a server holds is refused as locked."""
    scratch = Path(tempfile.mkdtemp(prefix="memrl-read-only-"))
    try:
        with _held_shared(folder):
            need, free = allocated_bytes(folder) + min_free_mb * MB, free_bytes(scratch)
            if free < need:
                raise DiskFullError(
                    f"a read-only open works on a copy of the memory store, and {scratch.parent} has "
                    f"{free / MB:.1f} MB free where the copy needs {need / MB:.1f} MB (the store's "
                    f"{(need - min_free_mb * MB) / MB:.1f} MB and min_free_disk_mb={min_free_mb}): point TMPDIR "
                    "to a folder with room"
                )
            if folder.is_dir():
                copy_sparse(folder, scratch / folder.name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


@contextmanager
def _held_shared(folder: Path) -> Iterator[None]:
    locks = [path for path in folder.rglob("*") if path.name in ("wal", ".lock")] if folder.is_dir() else []
    held: list[int] = []
    try:
        for path in locks:
            held.append(os.open(path, os.O_RDONLY))
            try:
                fcntl.flock(held[-1], fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreLockedError(folder, f"{path} is locked by the process serving it") from None
        yield
    finally:
        for fd in held:
            os.close(fd)


def new_id() -> str:
    """Point ids are UUIDs: both engines accept them, and they cannot be guessed."""
    return str(uuid.uuid4())
