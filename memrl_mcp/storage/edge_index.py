"""The embedded engine's shards rebuilt in a child process: the HNSW index of the memories, and the compaction of
any table.

qdrant-edge builds an index only in ``EdgeShard.optimize()``, which holds the GIL until it is done (measured: a
Python thread got no tick in 8.7 s of building 10,000 points; 1M take minutes): run in the server's process it
would stop every recall and report. So the server streams a table's points (ids, vectors, payloads) to a child
process that writes them into a new shard folder, indexes it if asked and exits; the server then opens that shard,
replays the writes it made meanwhile and swaps it in (:class:`memrl_mcp.storage.edge.EdgeStore`). The child runs at a
lower priority with one indexing thread, so that one core stays with the server.

The same rebuild, without the index, is how deleted points give their disk back: qdrant-edge only marks a deleted
point (deleting 90% of a 135 MB shard freed nothing, measured), and its ``optimize()``, which would vacuum it,
holds the GIL for the whole rewrite (1.4 s for 250 MB, without indexing). A new shard holds only the live points,
and the old folder, write-ahead log included, is removed.

Shard configurations are defined here, once (:func:`shard_config`): the server creates its tables with them too.

A built shard keeps its vectors and payloads in memory-mapped files that are read on demand (``Memory.Cold``), and
in RAM only the graph, the namespace index and int8 copies of the vectors (:func:`indexed_config`): at a million
memories the server held 0.9 GB resident, not the 1.5 GB of vectors and more of payloads (README, "A million
memories").

Run as ``python -m memrl_mcp.storage.edge_index FOLDER PARAMS_JSON`` with pickled batches of ``(id, vector, payload)``
on stdin (from the parent only: pickle is trusted here because nobody else writes that pipe), ended by ``None``.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

HNSW_M = 16  # links per node: Qdrant's default; recall@5 against exact 1.00 at 1M, ef 32-256 (perf/scale.py)
HNSW_EF_CONSTRUCT = 100  # Qdrant's default
BUILD_NICENESS = 10
INT8_QUANTILE = 0.99  # Qdrant's usual choice: the int8 range covers 99% of the components, outliers are clipped
RESCORE_OVERSAMPLING = 4.0  # candidates per result found on the int8 copies and rescored: recall@5 0.997 at 1M
# A shard without an index searches and counts on the calling thread: qdrant-edge's default search pool (a thread per
# CPU, woken for each call) cost 70 us of CPU per filtered top-5 over 20 points against 8 us, 214 against 125 over
# 1,980, and a count 14 us against 1.6 (one segment each). An indexed shard keeps the pool.
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


def payload_schema(edge: Any, field: str, kind: str) -> Any:
    """qdrant-edge's index parameters for a payload index of ``storage.INDEXES``. The graph's fields are held in
    RAM (every filtered search reads them); the others are memory-mapped and read on demand: held in RAM, the sort
    keys of a million memories took 3 s of CPU to load at every open."""
    graph = field in GRAPH_FIELDS
    memory = edge.Memory.Pinned if graph else edge.Memory.Cold
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


def indexed_config(edge: Any, params: ShardParams) -> Any:
    """An indexed shard (cosine): vectors and payloads memory-mapped, read on demand; the HNSW graph and int8 copies
    of the vectors in RAM (a quarter of the vectors' size), which the graph search reads; only the few best
    candidates are then rescored with their original vectors (:data:`RESCORE_OVERSAMPLING`), read from disk."""
    int8 = edge.ScalarQuantizationConfig(type=edge.ScalarType.Int8, quantile=INT8_QUANTILE, memory=edge.Memory.Pinned)
    vectors = edge.EdgeVectorParams(
        size=params.size, distance=edge.Distance.Cosine, memory=edge.Memory.Cold, quantization_config=int8
    )
    hnsw = edge.HnswIndexConfig(
        m=HNSW_M, ef_construct=HNSW_EF_CONSTRUCT, full_scan_threshold=params.full_scan_kb, max_indexing_threads=1
    )
    # indexing_threshold (KB): any segment larger than one vector is indexed when the child optimizes.
    optimizers = edge.EdgeOptimizersConfig(indexing_threshold=1)
    return edge.EdgeConfig(vectors=vectors, payload_memory=edge.Memory.Cold, hnsw_config=hnsw, optimizers=optimizers)


def build(folder: str, params: ShardParams, stream: Any) -> int:
    """Write the streamed points into a new shard at ``folder``, index it if ``params.hnsw``, close it; returns the
    points written."""
    import qdrant_edge as edge

    shard = edge.EdgeShard.create(folder, shard_config(edge, params))
    # For the graph: its fields before the points, so that it links per namespace (a filtered search stays in the
    # graph), and the others once it is built, so that they are built once, on the optimized segment.
    first = [(key, kind) for key, kind in params.payload_indexes if key in GRAPH_FIELDS or not params.hnsw]
    others = [(key, kind) for key, kind in params.payload_indexes if (key, kind) not in first]
    for key, kind in first:
        shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
    written = 0
    while (batch := pickle.load(stream)) is not None:
        _leave_room(folder, params.min_free)
        shard.update(edge.UpdateOperation.upsert_points([edge.Point(i, v, p) for i, v, p in batch]))
        written += len(batch)
    _leave_room(folder, params.min_free)
    if params.hnsw:
        shard.optimize()
    for key, kind in others:
        shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
    shard.flush()
    shard.close()
    return written


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
    with its requests), the child's writing and indexing after that, opening the new shard (holds the GIL), and
    the last replay round with writers held back."""

    points: int = 0
    stream_s: float = 0.0
    index_s: float = 0.0
    load_s: float = 0.0
    replayed: int = 0
    held_s: float = 0.0


@dataclass(frozen=True)
class Rebuild:
    """A rebuild of a table waiting or running; ``done`` is set once it is over (swapped in, failed or dropped)."""

    table: str
    hnsw: bool
    done: threading.Event = field(default_factory=threading.Event)


def main(argv: list[str]) -> int:
    folder, params = argv[0], ShardParams.from_json(argv[1])
    os.nice(BUILD_NICENESS)
    written = build(folder, params, sys.stdin.buffer)
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
