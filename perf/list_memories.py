"""list_memories: keyset pages on the engine's order_by against a scan-and-sort baseline (a benchmark, not a test).

For each engine and size N, N memories (the payload the service writes, spread over four namespaces) are loaded
through the Store API; then, in the same process over the same store:

- ``MemoryService.list_memories`` (sort by q, 20 per page): the first page, page 10 (through its cursor), and the
  first page of a full-text filter;
- the baseline a store without ``order_by`` needs for the same page: scroll the namespace's (id, q) pairs, sort
  them in Python, then fetch the page's payloads.

Every page is checked against the baseline's. Prints median milliseconds over ``--runs`` runs, and the ratio.

    .venv/bin/python perf/list_memories.py [--sizes 1000,10000,100000] [--runs 30]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import ListQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import EdgeStore, Point, QdrantClientStore, Store

PAGE = 20
NAMESPACE = B.NAMESPACES[0]


def load(store: Store, n: int, seed: int) -> None:
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    vectors, _ = B.clustered_vectors(n, rng, clusters=max(10, n // 100))
    now = time.time()
    for start in range(0, n, 1000):
        points = []
        for i in range(start, min(start + 1000, n)):
            namespace = B.NAMESPACES[i % len(B.NAMESPACES)]
            payload = B.memory_payload(prng, namespace, B.synthetic_text(prng, prng.randint(60, 160)), now)
            points.append(Point(str(uuid.UUID(int=prng.getrandbits(128), version=4)), vectors[i], payload))
        store.upsert("memories", points)


def baseline_page(store: Store, skip: int) -> list[str]:
    """Scan the namespace's (id, q), sort by (-q, id), fetch the page's payloads."""
    keys = sorted(
        (-float(payload["q"]), uuid.UUID(memory_id).int, memory_id)
        for memory_id, payload in store.scroll("memories", {"namespace": NAMESPACE}, ("q",))
    )
    page = [memory_id for _, _, memory_id in keys[skip : skip + PAGE]]
    fetched = store.get("memories", page)
    return [memory_id for memory_id in page if memory_id in fetched]


def measure(service: MemoryService, store: Store, runs: int) -> list[Any]:
    def page(cursor: str | None = None, text: str | None = None) -> Any:
        return service.list_memories(
            ListQuery(NAMESPACE, sort="q", limit=PAGE, cursor=cursor, text=text), access=EVERYTHING
        )

    first = page()
    deep, cursor = 0, first.next_cursor  # page 10, or the last one of a small namespace
    while cursor is not None and deep < 9:
        deep += 1
        later = page(cursor)
        if deep == 9 or later.next_cursor is None:
            break
        cursor = later.next_cursor
    assert [m.id for m in first.memories] == baseline_page(store, 0), "page 1 differs from the baseline's"
    if deep:
        assert [m.id for m in page(cursor).memories] == baseline_page(store, deep * PAGE), "a later page differs"
    keyset_first = B.p50(B.timed_ms(page, runs))
    keyset_tenth = B.p50(B.timed_ms(lambda: page(cursor), runs))
    text_first = B.p50(B.timed_ms(lambda: page(text="mug"), runs))
    scan = B.p50(B.timed_ms(lambda: baseline_page(store, 0), runs))
    return [first.total, keyset_first, keyset_tenth, text_first, scan, scan / keyset_first]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--engines", default="edge,qdrant-local")
    parser.add_argument("--qdrant-max-size", type=int, default=10000, help="largest size for qdrant-local")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    embedder = MiniLMEmbedder()
    rows = []
    for engine in args.engines.split(","):
        for n in (int(size) for size in args.sizes.split(",")):
            if engine == "qdrant-local" and n > args.qdrant_max_size:
                continue
            with tempfile.TemporaryDirectory() as folder:
                settings = load_settings(data_dir=Path(folder), embedded_engine=engine)
                store: Store = (
                    EdgeStore(Path(folder) / "edge", embedder.dim)
                    if engine == "edge"
                    else QdrantClientStore(embedder.dim, "bench", path=Path(folder) / "local")
                )
                load(store, n, args.seed)
                service = MemoryService(settings, embedder, store)
                try:
                    rows.append([engine, n, *measure(service, store, args.runs)])
                finally:
                    service.close()
    print(f"list_memories, {PAGE} per page, sorted by q; median ms of {args.runs} runs ({B.machine()})")
    headers = ["engine", "memories", "in namespace", "page 1", "page 10*", "text page 1", "scan+sort", "ratio"]
    print(B.table(headers, rows))
    print("* or the last page of a smaller namespace; ratio: scan+sort / page 1")


if __name__ == "__main__":
    main()
