"""Compare the two embedded engines of memrl_mcp.storage on the same memories (a benchmark, not a test).

For each size N, the same N memories (the exact payload MemoryService writes; clustered 384-d unit
vectors, so that a score threshold keeps a realistic handful) go into

- ``EdgeStore`` (qdrant-edge, the default embedded engine), and
- ``QdrantClientStore(path=...)`` (qdrant-client's local mode, on disk),

through the Store API only (``upsert`` in batches of 1000, ``search``, ``set_payload``, ``get``).
Measured per engine and size: bulk-load time, reopen time (close, then open the folder again),
top-5 search with a namespace filter and a score threshold (p50/p95), ``set_payload`` and ``get``
latency; and, in the same process over the same vectors, a numpy brute-force search as the baseline
(matrix @ query, mask, argpartition). Every engine answer is checked against the baseline's.

    .venv/bin/python perf/backends.py [--sizes 1000,10000,100000] [--queries 200]

qdrant-client's local mode is slow (pure Python/numpy: docs/performance.md, "The embedded engines compared"),
so its search is timed on fewer queries when they would exceed ``--budget`` seconds per cell,
and ``--qdrant-max-size`` can leave it out of the largest sizes; the table says when either happened.
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

from memrl_mcp.storage import EdgeStore, Point, QdrantClientStore, Store, Where

TOP_K = 5
THRESHOLD = 0.3  # same-cluster pairs sit near 0.4, unrelated ones near 0
FILTER: Where = {"namespace": B.NAMESPACES[0]}
BATCH = 1000
ENGINES = ("edge", "qdrant-local")


def make_data(n: int, queries: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    vectors, centres = B.clustered_vectors(n, rng, clusters=max(10, n // 100))
    namespaces = [B.NAMESPACES[i] for i in rng.integers(0, len(B.NAMESPACES), n)]
    now = time.time()
    ids = [str(uuid.UUID(int=prng.getrandbits(128), version=4)) for _ in range(n)]
    payloads = [
        B.memory_payload(prng, ns, B.synthetic_text(prng, prng.randint(60, 160)), now, {"bench": "backends", "i": i})
        for i, ns in enumerate(namespaces)
    ]
    # 90% of queries fall in a cluster (a handful of hits pass the threshold), 10% match nothing.
    picks = rng.integers(0, len(centres), queries)
    noise = rng.standard_normal((queries, B.DIM)).astype(np.float32) * (1.2 / np.sqrt(B.DIM))
    qvecs = B.unit(centres[picks] + noise)
    unrelated = rng.random(queries) < 0.1
    qvecs[unrelated] = B.unit(rng.standard_normal((int(unrelated.sum()), B.DIM)))
    return {
        "vectors": vectors,
        "allowed": np.array([ns == FILTER["namespace"] for ns in namespaces]),
        "ids": ids,
        "points": [Point(i, v, p) for i, v, p in zip(ids, vectors, payloads, strict=True)],
        "queries": qvecs,
    }


def open_engine(engine: str, folder: Path) -> Store:
    if engine == "edge":
        return EdgeStore(folder / "edge", B.DIM)
    return QdrantClientStore(B.DIM, "bench", path=folder / "qdrant-local")


def bulk_load(engine: str, folder: Path, points: list[Point]) -> tuple[Store, float]:
    store = open_engine(engine, folder)
    start = time.perf_counter()
    for i in range(0, len(points), BATCH):
        store.upsert("memories", points[i : i + BATCH])
    return store, time.perf_counter() - start


def bench_engine(engine: str, n: int, data: dict[str, Any], root: Path, args: argparse.Namespace) -> dict[str, Any]:
    # Load: repeated on fresh folders (up to 3 runs) while a run takes under 6 s.
    loads: list[float] = []
    store: Store | None = None
    while True:
        folder = root / f"{engine}-{n}-{len(loads)}"
        if store is not None:
            store.close()
            shutil.rmtree(folder.parent / f"{engine}-{n}-{len(loads) - 1}", ignore_errors=True)
        store, seconds = bulk_load(engine, folder, data["points"])
        loads.append(seconds)
        if len(loads) >= 3 or seconds > 6:
            break
    assert store is not None
    assert store.count("memories") == n, f"{engine}: {store.count('memories')} points after loading {n}"

    closes: list[float] = []
    opens: list[float] = []
    while len(opens) < 3 and sum(opens) < 4:  # three reopens, or one when it takes seconds
        start = time.perf_counter()
        store.close()
        closes.append(time.perf_counter() - start)
        gc.collect()
        start = time.perf_counter()
        store = open_engine(engine, folder)
        opens.append(time.perf_counter() - start)

    queries = data["queries"]
    for q in queries[:3]:  # warm-up
        store.search(q, TOP_K, THRESHOLD, FILTER)
    search_ms: list[float] = []
    paired_ms: list[float] = []
    agree = 0
    budget_end = time.perf_counter() + args.budget
    for q in queries:
        start = time.perf_counter()
        hits = store.search(q, TOP_K, THRESHOLD, FILTER)
        search_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()  # the baseline on the same query, right after: both see the same machine load
        expected = B.brute_force(data["vectors"], data["allowed"], q, TOP_K, THRESHOLD)
        paired_ms.append((time.perf_counter() - start) * 1000)
        agree += [h.id for h in hits] == [data["ids"][i] for i, _ in expected] or (
            # ties at float precision may swap neighbours: compare the score lists instead
            np.allclose([h.similarity for h in hits], [s for _, s in expected], atol=1e-4)
        )
        if len(search_ms) >= 20 and time.perf_counter() > budget_end:
            break

    rng = random.Random(1)
    set_ms, get_ms = [], []
    budget_end = time.perf_counter() + args.budget / 2
    for i in range(args.queries):
        memory_id = rng.choice(data["ids"])
        update = {"q": rng.uniform(-1, 1), "visits": i, "last_reward": 1.0, "updated_at": time.time()}
        start = time.perf_counter()
        store.set_payload("memories", memory_id, update)
        set_ms.append((time.perf_counter() - start) * 1000)
        batch = rng.sample(data["ids"], 5)
        start = time.perf_counter()
        got = store.get("memories", batch)
        get_ms.append((time.perf_counter() - start) * 1000)
        assert len(got) == 5
        if len(set_ms) >= 20 and time.perf_counter() > budget_end:
            break
    store.close()
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "load_s": statistics.median(loads),
        "load_runs": len(loads),
        "open_s": statistics.median(opens),
        "close_s": statistics.median(closes),
        "search": search_ms,
        "paired": paired_ms,
        "agree": agree / len(search_ms),
        "set": set_ms,
        "get": get_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated memory counts")
    parser.add_argument("--queries", type=int, default=200, help="search queries (and set_payload calls) per cell")
    parser.add_argument("--budget", type=float, default=30.0, help="max seconds of searching per engine and size")
    parser.add_argument("--qdrant-max-size", type=int, default=100_000, help="skip qdrant-local above this N")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    wall = time.perf_counter()
    print(f"backends: top-{TOP_K}, filter {FILTER}, score >= {THRESHOLD}, upsert batches of {BATCH}; {B.machine()}")

    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="memrl-bench-") as tmp:
        for n in sizes:
            data = make_data(n, args.queries, args.seed + n)
            base_ms = []
            for q in data["queries"]:
                start = time.perf_counter()
                B.brute_force(data["vectors"], data["allowed"], q, TOP_K, THRESHOLD)
                base_ms.append((time.perf_counter() - start) * 1000)
            base50 = B.p50(base_ms)
            hits = np.mean(
                [len(B.brute_force(data["vectors"], data["allowed"], q, TOP_K, THRESHOLD)) for q in data["queries"]]
            )
            rows.append(
                [n, "numpy brute force", "-", "-", "-", base50, B.pct(base_ms, 95), 1.0, 1.0, *["-"] * 3, len(base_ms)]
            )
            for engine in ENGINES:
                if engine == "qdrant-local" and n > args.qdrant_max_size:
                    rows.append([n, engine, "skipped (--qdrant-max-size)", *["-"] * 10])
                    continue
                started = time.perf_counter()
                r = bench_engine(engine, n, data, Path(tmp), args)
                results[(engine, n)] = r
                rows.append(
                    [
                        n,
                        engine,
                        f"{r['load_s']:.2f} ({r['load_runs']})",
                        r["open_s"],
                        r["close_s"],
                        B.p50(r["search"]),
                        B.pct(r["search"], 95),
                        B.p50(r["search"]) / base50,
                        B.p50(r["search"]) / B.p50(r["paired"]),
                        B.p50(r["set"]),
                        B.p50(r["get"]),
                        f"{r['agree']:.2f}",
                        len(r["search"]),
                    ]
                )
                print(f"  done {engine} N={n} in {time.perf_counter() - started:.0f} s", flush=True)
            print(f"  N={n}: mean hits per query (after threshold) {hits:.1f}", flush=True)
            del data
            gc.collect()

    print()
    headers = [
        "N",
        "engine",
        "load s (runs)",
        "reopen s",
        "close s",
        "search p50 ms",
        "p95 ms",
        "x numpy",
        "x paired",
        "set_payload p50 ms",
        "get(5) p50 ms",
        "same top-5",
        "queries",
    ]
    print(B.table(headers, rows))
    print(
        "\nload: median of up to 3 runs (fewer when one run takes > 6 s); "
        "reopen/close: median of up to 3 (fewer past 4 s); "
        "search/set_payload/get: per call, over `queries` calls (fewer where --budget cut them);\n"
        "x numpy = search p50 / numpy row p50 (a separate pass, same vectors and queries, before the engines);\n"
        "x paired = search p50 / p50 of the numpy search run on the same query right after each engine search (same "
        "machine load, but caches cooled by the engine's call); "
        "same top-5 = share of queries whose ids (or scores, on ties) equal the baseline's."
    )
    big = max((n for n in sizes if ("qdrant-local", n) in results and ("edge", n) in results), default=None)
    if big is not None:
        e, q = results[("edge", big)], results[("qdrant-local", big)]
        wins = {
            "load": q["load_s"] / e["load_s"],
            "reopen": q["open_s"] / e["open_s"],
            "search p50": B.p50(q["search"]) / B.p50(e["search"]),
            "search p95": B.pct(q["search"], 95) / B.pct(e["search"], 95),
            "set_payload p50": B.p50(q["set"]) / B.p50(e["set"]),
        }
        best = "edge" if sum(np.log(list(wins.values()))) > 0 else "qdrant-local"
        slower = [k for k, v in wins.items() if v < 1]
        print(f"\nqdrant-local / edge at N={big}: " + ", ".join(f"{k} {v:.1f}x" for k, v in wins.items()))
        print(
            f"Default engine: {best}. At N={big} edge is faster on "
            + (f"every measured operation but {', '.join(slower)}" if slower else "every measured operation")
            + (
                "; qdrant-edge is Qdrant's Rust engine in process (exact scan, payload indexes, WAL), its search stays "
                "near the numpy brute-force floor and its load is done in seconds; qdrant-client's local mode is a "
                "pure-Python brute force meant for tests (it warns above 20k points). Keep qdrant-local as the "
                "fallback, and a Qdrant server (MEMRL_QDRANT_URL) for memories beyond one machine."
                if best == "edge"
                else "; qdrant-client's local mode measured faster overall here: re-check the edge engine."
            )
        )
    print(f"\ntotal wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
