"""The HNSW index of the embedded engine's memories, built in a child process.

qdrant-edge builds an index only in ``EdgeShard.optimize()``, which holds the GIL until it is done (measured: a
Python thread got no tick in 8.7 s of building 10,000 points; 1M take minutes): run in the server's process it
would stop every recall and report. So the server streams its memories (ids, vectors, payloads) to a child
process that writes them into a new shard folder, indexes it and exits; the server then opens that shard, replays
the writes it made meanwhile and swaps it in (:class:`memrl_mcp.storage.EdgeStore`). The child runs at a lower
priority with one indexing thread, so that one core stays with the server.

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
from dataclasses import asdict, dataclass
from typing import Any

HNSW_M = 16  # links per node: Qdrant's default; recall@5 against exact 1.00 at 1M, ef 32-256 (perf/scale.py)
HNSW_EF_CONSTRUCT = 100  # Qdrant's default
BUILD_NICENESS = 10
INT8_QUANTILE = 0.99  # Qdrant's usual choice: the int8 range covers 99% of the components, outliers are clipped
RESCORE_OVERSAMPLING = 4.0  # candidates per result found on the int8 copies and rescored: recall@5 0.997 at 1M


@dataclass(frozen=True)
class IndexParams:
    """What the child needs to build a shard the server can open."""

    dim: int
    full_scan_kb: int  # a filter matching fewer vectors than this many KB is searched exactly (the planner's)
    payload_indexes: tuple[tuple[str, str], ...]  # the memories table's (field, kind), as storage.INDEXES

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> IndexParams:
        raw = json.loads(text)
        indexes = tuple((str(field), str(kind)) for field, kind in raw["payload_indexes"])
        return cls(int(raw["dim"]), int(raw["full_scan_kb"]), indexes)


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


def indexed_config(edge: Any, params: IndexParams) -> Any:
    """An indexed shard: vectors and payloads memory-mapped, read on demand; the HNSW graph and int8 copies of the
    vectors in RAM (a quarter of the vectors' size), which the graph search reads; only the few best candidates are
    then rescored with their original vectors (:data:`RESCORE_OVERSAMPLING`), read from disk."""
    int8 = edge.ScalarQuantizationConfig(type=edge.ScalarType.Int8, quantile=INT8_QUANTILE, memory=edge.Memory.Pinned)
    vectors = edge.EdgeVectorParams(
        size=params.dim, distance=edge.Distance.Cosine, memory=edge.Memory.Cold, quantization_config=int8
    )
    hnsw = edge.HnswIndexConfig(
        m=HNSW_M, ef_construct=HNSW_EF_CONSTRUCT, full_scan_threshold=params.full_scan_kb, max_indexing_threads=1
    )
    # indexing_threshold (KB): any segment larger than one vector is indexed when the child optimizes.
    optimizers = edge.EdgeOptimizersConfig(indexing_threshold=1)
    return edge.EdgeConfig(vectors=vectors, payload_memory=edge.Memory.Cold, hnsw_config=hnsw, optimizers=optimizers)


def build(folder: str, params: IndexParams, stream: Any) -> int:
    """Write the streamed points into a new shard at ``folder``, index it, close it; returns the points written."""
    import qdrant_edge as edge

    shard = edge.EdgeShard.create(folder, indexed_config(edge, params))
    # The graph's fields before the points, so that the graph links per namespace (a filtered search stays in the
    # graph); the others once it is built, so that they are built once, on the optimized segment.
    graph = [(key, kind) for key, kind in params.payload_indexes if key in GRAPH_FIELDS]
    others = [(key, kind) for key, kind in params.payload_indexes if key not in GRAPH_FIELDS]
    for key, kind in graph:
        shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
    written = 0
    while (batch := pickle.load(stream)) is not None:
        shard.update(edge.UpdateOperation.upsert_points([edge.Point(i, v, p) for i, v, p in batch]))
        written += len(batch)
    shard.optimize()
    for key, kind in others:
        shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
    shard.flush()
    shard.close()
    return written


def main(argv: list[str]) -> int:
    folder, params = argv[0], IndexParams.from_json(argv[1])
    os.nice(BUILD_NICENESS)
    written = build(folder, params, sys.stdin.buffer)
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
