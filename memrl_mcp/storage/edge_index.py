"""The embedded engine's shards rebuilt in a child process: the HNSW index of the memories, and the compaction of
any table.

qdrant-edge builds an index only in ``EdgeShard.optimize()``, which holds the GIL until it is done (no other Python
thread runs meanwhile, and a million points take minutes): run in the server's process it would stop every recall
and report. So the server streams a table's points (ids, vectors, payloads) to a child
process that writes them into a new shard folder, indexes it if asked and exits; the server then opens that shard,
replays the writes it made meanwhile and swaps it in (:class:`memrl_mcp.storage.edge.EdgeStore`). The child runs at a
lower priority with one indexing thread, so that one core stays with the server.

The same rebuild, without the index, is how deleted points give their disk back: qdrant-edge only marks a deleted
point (its bytes stay on disk), and its ``optimize()``, which would vacuum it, holds the GIL for the whole rewrite. A
new shard holds only the live points, and the old folder, write-ahead log included, is removed (the figures:
docs/performance.md, "Sizes on disk and in memory").

Shard configurations are defined here, once (:func:`shard_config`): the server creates and opens its tables with
them too (:func:`open_shard`).

A built shard is memory-mapped whole and read on demand (``Memory.Cold``, :func:`indexed_config`); :func:`warm_up`
keeps resident only what every search reads: the graph, the namespace index and int8 copies of the vectors, not the
1.5 GB of vectors of a million memories and more of payloads (docs/storage.md, "A million memories").

Run as ``python -m memrl_mcp.storage.edge_index FOLDER PARAMS_JSON`` with pickled batches of ``(id, vector, payload)``
on stdin (from the parent only: pickle is trusted here because nobody else writes that pipe), ended by ``None``.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from memrl_mcp.storage.disk import DiskFullError
from memrl_mcp.storage.files import write_atomically
from memrl_mcp.storage.store import StoreLockedError, Table

HNSW_M = 16  # links per node: Qdrant's default; recall@5 against exact 1.00 at 1M, ef 32-256 (perf/scale.py)
HNSW_EF_CONSTRUCT = 100  # Qdrant's default
BUILD_NICENESS = 10
PAGE_OUT_EVERY = 32_768  # points the child writes between two page-outs of its shard
PR_SET_PDEATHSIG = 1  # Linux prctl: the signal this process gets when its parent dies
INT8_QUANTILE = 0.99  # Qdrant's usual choice: the int8 range covers 99% of the components, outliers are clipped
RESCORE_OVERSAMPLING = 4.0  # candidates per result found on the int8 copies and rescored (2 lost recall on near-copies)
# A shard without an index searches and counts on the calling thread: qdrant-edge's default search pool (a thread per
# CPU, woken for each call) costs more CPU than a small search or a count itself (docs/performance.md, "Why the
# embedded engine is configured as it is"). An indexed shard keeps the pool.
EXACT_SEARCH_THREADS = 1


@dataclass(frozen=True)
class ShardParams:
    """What a shard of a table is: enough for the child to build one the server can open."""

    size: int  # of the table's vectors
    dot: bool  # scored by dot product (else cosine)
    cold: bool  # vectors and payloads memory-mapped, read on demand (the recalls)
    hnsw: bool  # HNSW-indexed (the memories, once many)
    full_scan_kb: int  # a filter matching fewer vectors than this many KB is searched exactly (the planner's)
    payload_indexes: tuple[tuple[str, str], ...]  # the table's (field, kind), as storage.INDEXES
    min_free: int = 0  # bytes of free disk a rebuild leaves to the server (min_free_disk_mb)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ShardParams:
        raw = json.loads(text)
        indexes = tuple((str(field), str(kind)) for field, kind in raw["payload_indexes"])
        flags = (bool(raw["dot"]), bool(raw["cold"]), bool(raw["hnsw"]))
        return cls(int(raw["size"]), *flags, int(raw["full_scan_kb"]), indexes, int(raw["min_free"]))


GRAPH_FIELDS = ("namespace",)
"""Payload fields whose values get links of their own in the HNSW graph: the filter of every search. Other indexed
fields (outcome, the sort keys, the full text) get none: each value of a keyword would cost a subgraph as large as
its memories (``outcome``: the whole store again), and a search filtering on them is filtered by namespace first."""


def payload_schema(edge: Any, field: str, kind: str, mapped: bool = False) -> Any:
    """qdrant-edge's index parameters for a payload index of ``storage.INDEXES``. In a plain shard the graph's
    fields are held in RAM (every filtered search reads them); the others, and every index of an indexed shard
    (``mapped``: loaded at a swap, warmed up by :func:`warm_up`), are memory-mapped and read on demand: held in RAM,
    the sort keys of a million memories cost seconds of CPU to load at every open."""
    graph = field in GRAPH_FIELDS
    memory = edge.Memory.Pinned if graph and not mapped else edge.Memory.Cold
    if kind == "keyword":
        return edge.KeywordIndexParams(enable_hnsw=graph, memory=memory)
    if kind == "float":
        return edge.FloatIndexParams(enable_hnsw=graph, memory=memory)
    if kind == "integer":
        return edge.IntegerIndexParams(enable_hnsw=graph, memory=memory)
    if kind == "text":
        return edge.TextIndexParams(enable_hnsw=graph, memory=memory)
    raise ValueError(f"no payload index kind {kind!r}")


def shard_config(edge: Any, params: ShardParams) -> Any:
    """A table's shard: :func:`indexed_config` for an HNSW one; else its vectors in RAM (memory-mapped, read on
    demand, for a cold table)."""
    distance = edge.Distance.Dot if params.dot else edge.Distance.Cosine
    if params.hnsw:
        return indexed_config(edge, params)
    if not params.cold:
        vectors = edge.EdgeVectorParams(size=params.size, distance=distance)
        return edge.EdgeConfig(vectors=vectors, max_search_threads=EXACT_SEARCH_THREADS)
    vectors = edge.EdgeVectorParams(size=params.size, distance=distance, memory=edge.Memory.Cold)
    return edge.EdgeConfig(vectors=vectors, payload_memory=edge.Memory.Cold, max_search_threads=EXACT_SEARCH_THREADS)


WAL_OPTIONS = {"segment_capacity": 1 << 20, "segment_queue_len": 1, "retain_closed": 1}
"""The write-ahead log's segment files: 1 MB instead of qdrant-edge's 32. The log keeps what no flush has
acknowledged yet, and besides, whatever it holds, the segment being written and one closed (and one made ahead,
empty): with 32 MB segments up to 64 MB a table, with 1 MB ones 2 MB. A write larger than a segment gets a segment
of its own size."""


def with_small_wal(path: Path, stored: dict[str, Any]) -> None:
    """Give the shard at ``path`` (its persisted config ``stored``; empty: a shard to create) the log's
    :data:`WAL_OPTIONS`, before the engine opens it. qdrant-edge's Python ``EdgeConfig`` has no parameter for them,
    but it takes them from the config file it keeps in the shard's folder, completed by the config given to
    ``load`` (a folder holding only that file is made a new shard). An existing shard's segment files keep their
    size until they are written through."""
    if stored.get("wal_options") != WAL_OPTIONS:
        path.mkdir(parents=True, exist_ok=True)
        config = json.dumps(stored | {"wal_options": WAL_OPTIONS}).encode()
        write_atomically(path / "edge_config.json", lambda stream: stream.write(config))


def open_shard(edge: Any, path: Path, params: ShardParams, dim: int) -> Any:
    """The server's shard at ``path``, created or loaded, with the payload indexes it lacks; a store of vectors
    other than ``dim``'s (the embedder's), the engine's lock and a full disk are told as such."""
    config_file = path / "edge_config.json"
    stored = json.loads(config_file.read_text()) if config_file.exists() else {}
    if "vectors" in stored:
        stored_dim = int(next(iter(stored["vectors"].values()))["size"])
        if stored_dim != params.size:
            raise ValueError(
                f"the store at {path} holds {stored_dim}-d vectors; the embedder makes {dim}-d ones "
                f"({params.size}-d in this table)"
            )
    try:
        with_small_wal(path, stored)
        if "vectors" not in stored:  # new, or a creation a crash cut short
            shard = edge.EdgeShard.load(str(path), shard_config(edge, params))
        elif params.cold and stored.get("payload_memory") != "cold":
            # A store made before recalls were memory-mapped: loading with a config rewrites it (that needs
            # a little room, so it is done only when something changes).
            shard = edge.EdgeShard.load(str(path), shard_config(edge, params))
        else:
            shard = edge.EdgeShard.load(str(path))
    except Exception as error:
        if "WouldBlock" in str(error):
            raise StoreLockedError(path, "its write-ahead log is locked") from None
        if "No space left on device" in str(error):  # the engine writes a little at every open
            raise DiskFullError(
                f"cannot open the memory store at {path}: its disk is full. Free some space; meanwhile a "
                "read-only server (MEMRL_TOOL_PROFILE=read_only) serves it and `memrl-mcp export` backs it up: "
                "both open a copy of it in TMPDIR"
            ) from None
        raise
    indexed = set(shard.info().payload_schema)
    for key, kind in params.payload_indexes:
        if key not in indexed:
            shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
    return shard


def indexed_config(edge: Any, params: ShardParams) -> Any:
    """An indexed shard (cosine): every part of it memory-mapped, read on demand. A search walks the HNSW graph on
    int8 copies of the vectors (a quarter of their size) and rescores only the few best candidates with their
    original vectors (:data:`RESCORE_OVERSAMPLING`); :func:`warm_up` keeps the graph, the int8 copies and the
    namespace index resident. None of it is read at load: the server loads a new generation holding the GIL, which
    stops every request (for seconds at a million memories when the int8 copies were read into RAM at load)."""
    int8 = edge.ScalarQuantizationConfig(type=edge.ScalarType.Int8, quantile=INT8_QUANTILE, memory=edge.Memory.Cold)
    vectors = edge.EdgeVectorParams(
        size=params.size, distance=edge.Distance.Cosine, memory=edge.Memory.Cold, quantization_config=int8
    )
    hnsw = edge.HnswIndexConfig(
        m=HNSW_M, ef_construct=HNSW_EF_CONSTRUCT, full_scan_threshold=params.full_scan_kb, max_indexing_threads=1
    )
    # indexing_threshold (KB): any segment larger than one vector is indexed when the child optimizes.
    optimizers = edge.EdgeOptimizersConfig(indexing_threshold=1)
    return edge.EdgeConfig(vectors=vectors, payload_memory=edge.Memory.Cold, hnsw_config=hnsw, optimizers=optimizers)


WARM = re.compile(
    r"/segments/[^/]+/(vector_storage/(quantized\.data|vectors/chunk_\d+\.mmap)|vector_index/.+|payload_index/[^/]+-("
    + "|".join(re.escape(name[:8]) for name in GRAPH_FIELDS)
    + r")-[^/]+/.+)$"
)
"""The files of a shard that every search reads: the int8 vectors, the graph and the namespace index of its indexed
segment, and the vectors of a segment without an index (the whole of an unindexed shard; the memories written since
the last build beside an index), searched exactly (qdrant-edge's names; tests/test_scale.py fails if they no longer
match)."""
MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim a range's pages as memory pressure would (a dirty page is kept)
MADV_POPULATE_READ = 22  # Linux >= 5.14: map a range's pages as a read of each would, without reading them here


def warm_up(folder: Path) -> int:
    """Make the files :data:`WARM` names of the shard at ``folder`` resident, then map their pages in the engine's
    own mappings of them; returns the bytes of those mappings.

    Done in a thread while the server serves: it holds the GIL only between reads, for short gaps. Reading the files
    in order is far faster than the engine's own faults, one 4 KB page at a time. Mapped pages stay resident: this
    VM's DAMON reclaim pages out file pages no process maps once unused for a minute, and an unmapped int8 copy made
    the next searches read it from disk, an order of magnitude slower (the figures: docs/performance.md). On a system
    without /proc or MADV_POPULATE_READ the files are only read into the page cache."""
    mappings = [mapping for mapping in _mappings(folder) if WARM.search(mapping.path)]
    # The engine maps the vector chunks of a segment without an index twice, to read and to write, and searches read
    # through either (which one depends on the filter): populating both counted each page twice in the RSS at once.
    # A file mapped both ways is warmed through the second.
    writable = {mapping.path for mapping in mappings if mapping.writable}
    mappings = [mapping for mapping in mappings if mapping.writable or mapping.path not in writable]
    chunk = bytearray(1 << 22)
    for path in sorted({mapping.path for mapping in mappings}):
        try:
            with open(path, "rb", buffering=0) as stream:
                while stream.readinto(chunk):
                    pass
        except OSError:  # a retired generation, removed meanwhile
            return 0
    warm = _advise(mappings, MADV_POPULATE_READ)
    # What the load read besides (the write-ahead log, pages of an unindexed segment's full-text indexes) is given
    # back: no search needs it resident.
    release(folder)
    return warm


def release(folder: Path) -> int:
    """Give back the pages this process maps of the shard at ``folder`` that no search keeps resident (all but
    :data:`WARM`'s: the payloads, the original vectors, the other indexes, the write-ahead log), as memory pressure
    would; returns the bytes of those mappings. A full read of a table maps every page it reads, and they count
    in the process's RSS until unmapped: the first open of a million memories (a recount and a schema check, each
    reading every payload) nearly doubled it, and a rebuild's stream reads the vectors too."""
    return _advise([mapping for mapping in _mappings(folder) if not WARM.search(mapping.path)], MADV_PAGEOUT)


class Mapping(NamedTuple):
    """One of this process's mappings of a file (a line of /proc/self/maps)."""

    start: int
    length: int
    path: str
    writable: bool


def _mappings(folder: Path) -> list[Mapping]:
    """This process's mappings of the files under ``folder``; none without /proc."""
    prefix = f"{folder.resolve()}/"
    found = []
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            start, end = (int(address, 16) for address in fields[0].split("-"))
            found.append(Mapping(start, end - start, fields[5], fields[1][1] == "w"))
    return found


def _advise(mappings: list[Mapping], advice: int) -> int:
    """madvise each mapping (without the GIL); a range unmapped meanwhile, or an advice the kernel lacks, fails
    harmlessly: both advices only ever change which pages are resident, never what they hold."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for mapping in mappings:
        libc.madvise(mapping.start, mapping.length, advice)
    return sum(mapping.length for mapping in mappings)


def build(folder: str, params: ShardParams, stream: Any) -> int:
    """Write the streamed points into a new shard at ``folder``, index it if ``params.hnsw``, close it; returns the
    points written."""
    import qdrant_edge as edge

    with_small_wal(Path(folder), {})
    shard = edge.EdgeShard.load(folder, shard_config(edge, params))
    # For the graph: its fields before the points, so that it links per namespace (a filtered search stays in the
    # graph), and the others once it is built, so that they are built once, on the optimized segment.
    first = [(key, kind) for key, kind in params.payload_indexes if key in GRAPH_FIELDS or not params.hnsw]
    others = [(key, kind) for key, kind in params.payload_indexes if (key, kind) not in first]
    for key, kind in first:
        shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind, params.hnsw)))
    written = 0
    while (batch := pickle.load(stream)) is not None:
        _leave_room(folder, params.min_free)
        for part in log_sized(batch):
            shard.update(edge.UpdateOperation.upsert_points([edge.Point(i, v, p) for i, v, p in part]))
        written += len(batch)
        if written % PAGE_OUT_EVERY < len(batch):
            _page_out(shard, folder)
    _leave_room(folder, params.min_free)
    if params.hnsw:
        _page_out(shard, folder)
        shard.optimize()
        _page_out(shard, folder)
    for key, kind in others:
        shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind, params.hnsw)))
    shard.flush()
    shard.close()
    return written


def log_sized(batch: list[tuple[Any, list[float], dict[str, Any]]]) -> Iterator[list[Any]]:
    """``batch`` in parts of about a write-ahead log segment each. The log keeps, after the last flush, the segment
    being written and the one before, and a write larger than a segment gets one of its size: written whole, the
    stream's last two pages would stay in the new generation's log, a second copy of most of a small table."""
    part: list[Any] = []
    size = 0
    for point in batch:
        part.append(point)
        size += 4 * len(point[1]) + len(pickle.dumps(point[2], pickle.HIGHEST_PROTOCOL))
        if size >= WAL_OPTIONS["segment_capacity"]:
            yield part
            part, size = [], 0
    if part:
        yield part


def _page_out(shard: Any, folder: str) -> None:
    """Write the shard's pages and give them back: the child maps every page it writes (and the index build every
    vector it reads), and they count in its RSS until unmapped (a dirty page is kept: hence the flush)."""
    shard.flush()
    _advise(_mappings(Path(folder)), MADV_PAGEOUT)


def _leave_room(folder: str, min_free: int) -> None:
    """Stop before the disk falls below the server's margin (it refuses its own writes there): a rebuild writes a
    whole copy of its table, and must not take the room the server's writes were promised."""
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if free < min_free:
        raise SystemExit(f"stopped: {free >> 20} MB free, below the server's min_free_disk_mb ({min_free >> 20} MB)")


@dataclass
class BuildTimes:
    """Where a rebuild's time went: streaming the table's points to the child (the server's share, interleaved
    with its requests), the child's writing and indexing after that, opening the new shard (holds the GIL), the
    last replay round with writers held back, and closing and removing the old shard (its close holds the GIL)."""

    points: int = 0
    stream_s: float = 0.0
    index_s: float = 0.0
    load_s: float = 0.0
    replayed: int = 0
    held_s: float = 0.0
    retire_s: float = 0.0


@dataclass(frozen=True)
class Rebuild:
    """A rebuild of a table waiting or running; ``done`` is set once it is over (swapped in, failed or dropped)."""

    table: Table
    hnsw: bool
    done: threading.Event = field(default_factory=threading.Event)


def main(argv: list[str]) -> int:
    folder, params = argv[0], ShardParams.from_json(argv[1])
    os.nice(BUILD_NICENESS)
    # Die with the server: killed (SIGKILL), it could not stop this child, which went on writing into the folder
    # that the restarted server removes as a stray (its removal failed: "Directory not empty").
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    written = build(folder, params, sys.stdin.buffer)
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
