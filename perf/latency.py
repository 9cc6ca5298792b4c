"""End-to-end latency of recall_experience and report_outcome through the real MCP SDK (a benchmark, not a test).

For each size N, the default embedded engine (qdrant-edge) is pre-filled through the Store API
(bulk ``upsert`` of points with exactly the payload MemoryService writes), then closed, and the two
tools are timed through ``mcp.Client``:

- in process: ``Client(create_server(service))``;
- over stdio: ``StdioServerParameters(python -m memrl_mcp.cli --no-attach --data-dir D)``, a real server process;
- and, for attribution, the service called directly (no MCP).

Every recall is followed by its report (no pending recalls pile up). Two passes per mode: reports that
carry an experience (stored or merged: the realistic case) and reports with a reward only. Baseline,
same process and same vectors: embed the task with the same MiniLM embedder + numpy brute-force
top-k1 over the namespace (no MCP, no store). Targets: in-process recall p50 within 2x of the
baseline p50 at 100k; report_outcome p50 < 5 ms.

Vectors: the real MiniLM embeddings of the distinct task texts of the shared benchmark data
(ALFWorld goals, LifelongAgentBench OS/DB instructions, BigCodeBench prompts), each memory being a
perturbed copy of one (cosine 0.78-0.96 to its text), so that 100k memories need only ~2k embeddings;
queries are real task texts embedded by the server. Without the shared data: synthetic texts.

    .venv/bin/python perf/latency.py --sizes 1000,10000,100000 --queries 200
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import OutcomeReport, RecallQuery, StatsQuery
from memrl_mcp.settings import Settings, load_settings
from memrl_mcp.storage import EdgeStore, Point, open_store
from memrl_mcp.surface.server import create_server

BATCH = 1000
WARMUP = 10


# ---------------------------------------------------------------- data


def corpus(embedder: MiniLMEmbedder, seed: int, shared: Path) -> tuple[list[tuple[str, str]], np.ndarray, str]:
    """(namespace, text) pairs, their embeddings, and a description of where they came from."""
    texts = B.real_task_texts(shared)
    if texts:
        pairs = [(ns, t) for ns, group in texts.items() for t in group]
        source = "real task texts (" + ", ".join(f"{ns} {len(g)}" for ns, g in texts.items()) + ")"
    else:
        rng = random.Random(seed)
        pairs = [(B.NAMESPACES[i % 4], B.synthetic_text(rng, rng.randint(40, 200))) for i in range(2000)]
        source = "synthetic texts (shared benchmark data not found)"
    # The corpus embeddings are cached outside the repository (a few seconds on an idle machine, minutes on a busy one).
    digest = hashlib.sha256("\n".join([embedder.name, *(t for _, t in pairs)]).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / "memrl-bench-cache" / f"corpus-{digest}.npy"
    if cache.is_file():
        vectors = np.load(cache)
        source += f"; {len(pairs)} embeddings from cache {cache}"
    else:
        start = time.perf_counter()
        vectors = embedder.embed([t for _, t in pairs])
        source += f"; {len(pairs)} embedded in {time.perf_counter() - start:.1f} s"
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, vectors)
    return pairs, vectors, source


def memories(n: int, pairs: list[tuple[str, str]], base: np.ndarray, seed: int) -> tuple[list[Point], np.ndarray]:
    """n points: memory j is a perturbed copy of text j mod len(pairs) (shuffled), payload as the service writes."""
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    order = rng.permutation(len(pairs))
    which = order[np.arange(n) % len(pairs)]
    spread = rng.uniform(0.3, 0.8, n)[:, None] / np.sqrt(B.DIM)
    vectors = B.unit(base[which] + rng.standard_normal((n, B.DIM)).astype(np.float32) * spread)
    now = time.time()
    points = []
    for j in range(n):
        ns, text = pairs[which[j]]
        variant = j // len(pairs)
        task = text if variant == 0 else f"{text} (variant {variant})"
        payload = B.memory_payload(prng, ns, task, now, {"benchmark": ns, "variant": variant})
        points.append(Point(str(uuid.UUID(int=prng.getrandbits(128), version=4)), vectors[j], payload))
    return points, vectors


def prefill(settings: Settings, points: list[Point]) -> float:
    """Fill the store, then, on the embedded default, build the HNSW index a server builds in the background once it
    holds ``index_min_memories``: the figures are those of a server in its steady state, not mid-build. Returns the
    seconds both took."""
    store = open_store(settings.storage, B.DIM)
    start = time.perf_counter()
    for i in range(0, len(points), BATCH):
        store.upsert("memories", points[i : i + BATCH])
    store.close()
    storage = settings.storage
    embedded_edge = not storage.qdrant_url and storage.embedded_engine == "edge"
    if embedded_edge and 0 < storage.index_min_memories <= len(points):
        edge = EdgeStore(storage.data_dir / storage.collection / "edge", B.DIM)
        edge.build_index(wait=True)
        edge.close()
    return time.perf_counter() - start


# ---------------------------------------------------------------- timing loops


def experience_text(rng: random.Random) -> str:
    return "Steps that worked: " + B.synthetic_text(rng, rng.randint(260, 320))


class Baseline:
    """Embed the task + numpy brute-force top-k1 in the namespace, over the same vectors as the store."""

    def __init__(self, embedder, matrix: np.ndarray, namespaces: np.ndarray, k: int, delta: float) -> None:
        self.embedder, self.matrix, self.k, self.delta = embedder, matrix, k, delta
        self.masks = {ns: namespaces == ns for ns in set(namespaces.tolist())}
        self.empty = np.zeros(len(matrix), dtype=bool)

    def __call__(self, ns: str, task: str, out: dict) -> None:
        start = time.perf_counter()
        vector = self.embedder.embed([task])[0]
        mid = time.perf_counter()
        B.brute_force(self.matrix, self.masks.get(ns, self.empty), vector, self.k, self.delta)
        end = time.perf_counter()
        out["embed"].append((mid - start) * 1000)
        out["baseline"].append((end - start) * 1000)


def new_record() -> dict[str, list]:
    return {"recall": [], "report": [], "found": [], "embed": [], "baseline": []}


def trimmed(record: dict[str, list]) -> dict[str, list]:
    return {key: values[WARMUP:] for key, values in record.items()}


async def mcp_loop(client: Client, queries, with_experience: bool, seed: int, baseline: Baseline) -> dict:
    """recall then report per query; the baseline runs on the same query just before (paired under equal load)."""
    rng = random.Random(seed)
    out = new_record()
    recall_ms, report_ms, found = out["recall"], out["report"], out["found"]
    for ns, task in queries:
        baseline(ns, task, out)
        start = time.perf_counter()
        result = await client.call_tool("recall_experience", {"task": task, "namespace": ns})
        recall_ms.append((time.perf_counter() - start) * 1000)
        if result.is_error:
            raise RuntimeError(f"recall_experience failed: {result.content}")
        found.append(len(result.structured_content["memories"]))
        report: dict[str, Any] = {
            "recall_id": result.structured_content["recall_id"],
            "reward": rng.choice([1.0, -1.0]),
        }
        if with_experience:
            report["experience"] = experience_text(rng)
        start = time.perf_counter()
        result = await client.call_tool("report_outcome", report)
        report_ms.append((time.perf_counter() - start) * 1000)
        if result.is_error:
            raise RuntimeError(f"report_outcome failed: {result.content}")
    return trimmed(out)


def direct_loop(service: MemoryService, queries, with_experience: bool, seed: int, baseline: Baseline) -> dict:
    rng = random.Random(seed)
    out = new_record()
    recall_ms, report_ms, found = out["recall"], out["report"], out["found"]
    for ns, task in queries:
        baseline(ns, task, out)
        start = time.perf_counter()
        result = service.recall(RecallQuery(task, ns), access=EVERYTHING)
        recall_ms.append((time.perf_counter() - start) * 1000)
        found.append(len(result.memories))
        experience = experience_text(rng) if with_experience else None
        start = time.perf_counter()
        service.report(OutcomeReport(result.recall_id, rng.choice([1.0, -1.0]), experience), access=EVERYTHING)
        report_ms.append((time.perf_counter() - start) * 1000)
    return trimmed(out)


# ---------------------------------------------------------------- main


async def run_size(n: int, args, embedder, pairs, base, queries, overrides, env, root: Path) -> dict[str, Any]:
    data_dir = root / f"n{n}"
    settings = load_settings(data_dir=data_dir, embedded_engine="edge", **overrides)
    points, matrix = memories(n, pairs, base, args.seed + n)
    namespaces = np.array([p.payload["namespace"] for p in points])
    load_s = prefill(settings, points)
    del points
    gc.collect()
    out: dict[str, Any] = {"load_s": load_s}

    # Baseline and the direct / in-process modes share one service (the store's folder is locked).
    start = time.perf_counter()
    service = MemoryService(settings, embedder, open_store(settings.storage, B.DIM))
    out["open_s"] = time.perf_counter() - start
    base = Baseline(embedder, matrix, namespaces, settings.retrieval.k1, service.scale.delta)
    out["delta"], out["merge"] = service.scale.delta, service.scale.merge_threshold
    out["direct"] = direct_loop(service, queries, True, 1, base)
    out["direct_noexp"] = direct_loop(service, queries, False, 2, base)
    async with Client(create_server(service)) as client:
        out["inproc"] = await mcp_loop(client, queries, True, 3, base)
        out["inproc_noexp"] = await mcp_loop(client, queries, False, 4, base)
    out["stats_ms"] = B.timed_ms(lambda: service.stats(StatsQuery(), access=EVERYTHING), 3)
    service.close()

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memrl_mcp.cli", "--no-attach", "--data-dir", str(data_dir)],
        env=env,
        cwd=str(B.REPO),
    )
    start = time.perf_counter()
    async with Client(params) as client:
        out["spawn_s"] = time.perf_counter() - start
        out["stdio"] = await mcp_loop(client, queries, True, 5, base)
        out["stdio_noexp"] = await mcp_loop(client, queries, False, 6, base)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated memory counts")
    parser.add_argument("--queries", type=int, default=200, help="timed recall+report pairs per mode and pass")
    parser.add_argument("--delta", type=float, help="MEMRL_DELTA for every mode (default: the embedder's)")
    parser.add_argument("--merge-threshold", type=float, help="MEMRL_MERGE_THRESHOLD (default: the embedder's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    wall = time.perf_counter()

    overrides: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
    if args.delta is not None:
        overrides["delta"] = args.delta
        env["MEMRL_DELTA"] = str(args.delta)
    if args.merge_threshold is not None:
        overrides["merge_threshold"] = args.merge_threshold
        env["MEMRL_MERGE_THRESHOLD"] = str(args.merge_threshold)
    shared = B.shared_data_dir()  # MEMRL_SHARED_DATA: where the task texts are, not a server setting
    for key in [k for k in os.environ if k.startswith("MEMRL_")]:
        os.environ.pop(key)  # the in-process service must read the same settings as the stdio server

    embedder = MiniLMEmbedder()
    pairs, base, source = corpus(embedder, args.seed, shared)
    rng = random.Random(args.seed)
    queries = [rng.choice(pairs) for _ in range(args.queries + WARMUP)]
    print(f"latency: {B.machine()}; engine edge; vectors: {source}")
    print(
        f"  memories are perturbed copies of those embeddings; queries: {args.queries} (+{WARMUP} warm-up) "
        "real task texts"
    )

    results = {}
    with tempfile.TemporaryDirectory(prefix="memrl-latency-") as tmp:
        for n in sizes:
            started = time.perf_counter()
            results[n] = asyncio.run(run_size(n, args, embedder, pairs, base, queries, overrides, env, Path(tmp)))
            r = results[n]
            print(
                f"  N={n}: prefill {r['load_s']:.1f} s (index included), service open {r['open_s']:.2f} s, "
                f"stdio spawn-to-ready {r['spawn_s']:.2f} s, delta {r['delta']}, merge_threshold {r['merge']}, "
                f"memories per recall {statistics.mean(r['inproc']['found']):.1f}; "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )

    rows = []
    for n, r in results.items():
        modes = (("direct", "service (no MCP)"), ("inproc", "MCP in process"), ("stdio", "MCP stdio"))
        pooled = [x for key, _ in modes for x in r[key]["baseline"]]
        embeds = [x for key, _ in modes for x in r[key]["embed"]]
        rows.append([n, "baseline: embed + numpy", B.p50(pooled), B.pct(pooled, 95), 1.0, "-", "-", "-", "-", "-"])
        rows.append([n, "  of which embed", B.p50(embeds), B.pct(embeds, 95), "-", "-", "-", "-", "-", "-"])
        for key, label in modes:
            a, b = r[key], r[f"{key}_noexp"]
            rows.append(
                [
                    n,
                    label,
                    B.p50(a["recall"]),
                    B.pct(a["recall"], 95),
                    B.p50(a["recall"]) / B.p50(a["baseline"]),
                    B.p50(a["baseline"]),
                    B.p50(a["report"]),
                    B.pct(a["report"], 95),
                    B.p50(b["report"]),
                    B.pct(b["report"], 95),
                ]
            )
    print()
    headers = [
        "N",
        "mode",
        "recall p50 ms",
        "p95",
        "x baseline",
        "(paired base p50)",
        "report+exp p50 ms",
        "p95",
        "report p50 ms",
        "p95",
    ]
    print(B.table(headers, rows))
    print(
        "\nrecall: the pass whose reports carry an experience; report+exp: report_outcome with a ~300-char experience"
        " (stored or merged); report: reward only.\nx baseline = recall p50 / p50 of the baseline run on the same"
        " query just before each recall of that pass (paired, so both see the same machine load);"
        " baseline row: all passes pooled."
        " stats = memory_stats() through the service, median of 3: "
        + ", ".join(f"N={n} {B.p50(r['stats_ms']):.0f} ms" for n, r in results.items())
    )
    largest = max(results)
    r = results[largest]
    ratio = B.p50(r["inproc"]["recall"]) / B.p50(r["inproc"]["baseline"])
    rep = B.p50(r["inproc"]["report"])
    rep_noexp = B.p50(r["inproc_noexp"]["report"])
    print(
        f"\ntargets at N={largest}, in process: recall p50 / baseline p50 = {ratio:.2f} (target <= 2: "
        f"{'met' if ratio <= 2 else 'NOT met'}); report_outcome p50 = {rep:.2f} ms with experience, "
        f"{rep_noexp:.2f} ms reward only (target < 5 ms: {'met' if rep < 5 else 'NOT met'} / "
        f"{'met' if rep_noexp < 5 else 'NOT met'})"
    )
    print(f"total wall time {time.perf_counter() - wall:.0f} s; {B.machine()}")


if __name__ == "__main__":
    main()
