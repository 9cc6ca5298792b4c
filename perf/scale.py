"""A million memories in the embedded engine: HNSW against exact search, recalls during an index build, start-up,
resident memory, ``memory_stats`` and import throughput (a benchmark; its figures: docs/performance.md).

The store holds the benchmarks' real task texts (ALFWorld goals, LLB instructions, BigCodeBench prompts, embedded
with the shipped MiniLM) and perturbed copies of them up to ``--size`` (replicated vectors: each copy is its text's
vector plus Gaussian noise, cosine 0.75-0.95 to it; payloads as the service writes them). Queries are the real
texts, in their benchmark's namespace: the hardest case for an index, each query's neighbours being hundreds of
near-copies of it.

Phases, each printed as it ends:
0. exact filtered search at growing sizes against the query embedding (where a store should get an index);
1. preload (skipped when ``--store`` already holds the memories; one big store is reused across runs);
2. an index build in the background while this process keeps searching and writing (``--build-load idle``: while
   it does nothing, for the build's own time): latency percentiles of searches (filtered, top-5) and conditional
   writes before and during the build, the slowest writes placed in the build's steps, peak RSS of this process
   and of the build's child;
3. recall@5 of HNSW against exact search on the same store, per ``ef``, with latency medians and the ratio;
4. in a fresh process, three times (the last with the store's files read into the page cache first): open time
   (store and service, model included), ``memory_stats`` time, in-process recall latency (embedding + search +
   logging the recall) against the query embedding alone, resident memory;
5. import throughput: ``memrl-mcp import`` of ``--import-size`` memories against embedding the same tasks alone;
6. over MCP stdio (a spawned ``memrl-mcp`` on the store): ``recall_experience`` against the query embedding plus a
   round trip (``memory_stats``, whose own work is the counts' few ms at most), alternating query by query;
7. start-up over MCP stdio: from spawning ``memrl-mcp`` to the first ``recall_experience`` answer, with the page
   cache dropped first (``--cold``, as root: ``echo 3 > /proc/sys/vm/drop_caches``) or not, and the server's peak
   RSS (``VmHWM``) then.

    .venv/bin/python perf/scale.py --size 1000000 --store /work/scale-data/1m
    .venv/bin/python perf/scale.py --size 3000 --queries 20 --import-size 200     # a tiny run (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _bench as B
from latency import corpus

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import RecallQuery, StatsQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import EdgeStore, Point

BATCH = 1000
K = 5


def status_mb(pid: int | str = "self") -> dict[str, float]:
    """A process's resident memory (MB): VmRSS, its anonymous and file-backed parts, and its peak VmHWM."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def children() -> list[int]:
    """The live child processes of this one."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


class PeakRss:
    """Peak RSS of this process (its VmHWM, reset at the start) and of its children, and the peaks of their
    anonymous parts (sampled every 0.2 s): the rest is pages of memory-mapped files, which the kernel can reclaim."""

    def __enter__(self) -> PeakRss:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self.children = self.children_anon = self.own_anon = 0.0
        self.child_samples: list[tuple[float, float, float]] = []  # (s since the start, RSS, anonymous) in MB
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.own_anon = max(self.own_anon, status_mb()["RssAnon"])
            for pid in children():
                with contextlib.suppress(OSError, KeyError):  # a child gone meanwhile
                    memory = status_mb(pid)
                    self.children = max(self.children, memory["VmRSS"])
                    self.children_anon = max(self.children_anon, memory["RssAnon"])
                    self.child_samples.append((time.perf_counter() - self._start, memory["VmRSS"], memory["RssAnon"]))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        self.own = status_mb()["VmHWM"]

    def __str__(self) -> str:
        return (
            f"peak RSS {self.own:.0f} MB (this process; anonymous {self.own_anon:.0f}), {self.children:.0f} MB "
            f"(the build's child; anonymous {self.children_anon:.0f})"
        )

    def child_peaks(self, stream_s: float) -> str:
        """The child's peak RSS (and anonymous) while the points streamed, and after (indexing, closing)."""
        parts = []
        for name, during in (("streaming", True), ("after the stream", False)):
            samples = [(rss, anon) for at, rss, anon in self.child_samples if (at <= stream_s) == during]
            if samples:
                parts.append(f"{name} {max(s[0] for s in samples):.0f} MB ({max(s[1] for s in samples):.0f} anon)")
        return "; ".join(parts)


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {B.p50(values):.2f}  p95 {B.pct(values, 95):.2f}  p99 {B.pct(values, 99):.2f}  max {max(values):.1f}"


# ---------------------------------------------------------------- store


def store_dir(args: argparse.Namespace) -> Path:
    return Path(args.store) / "memrl" / "edge"


def preload(args: argparse.Namespace, pairs: list[tuple[str, str]], base: np.ndarray) -> None:
    """Write ``--size`` memories in batches (the real texts first, then their perturbed copies); no index."""
    folder = store_dir(args)
    store = EdgeStore(folder, B.DIM)
    try:
        have = store.index_status()[0]
        if have >= args.size:
            print(f"preload: {have} memories already in {folder}")
            return
        rng = np.random.default_rng(args.seed)
        prng = random.Random(args.seed)
        now = time.time()
        # One payload per text, varied per copy in the fields that vary (building each from scratch is slow at 1M).
        templates = [B.memory_payload(prng, namespace, text, now) for namespace, text in pairs]
        start = time.perf_counter()
        for first in range(have, args.size, BATCH):
            which = np.arange(first, min(first + BATCH, args.size)) % len(pairs)
            noise = rng.standard_normal((len(which), B.DIM)).astype(np.float32)
            spread = rng.uniform(0.3, 0.8, (len(which), 1)).astype(np.float32) / np.sqrt(B.DIM)
            copies = first + np.arange(len(which)) >= len(pairs)
            vectors = np.where(copies[:, None], B.unit(base[which] + noise * spread), base[which])
            points = []
            for j, vector in zip(which, vectors, strict=True):
                visits = prng.randint(0, 20)
                payload = templates[j] | {
                    "outcome": "success" if prng.random() < 0.7 else "failure",
                    "q": round(prng.uniform(-1.0, 1.0), 4) if visits else 0.0,
                    "visits": visits,
                }
                points.append(Point(str(uuid.UUID(int=prng.getrandbits(128), version=4)), vector, payload))
            store.upsert("memories", points)
            if (first // BATCH) % 50 == 0:
                done = first + len(which)
                print(f"  preload {done}/{args.size} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
        print(f"preload: {args.size - have} memories in {time.perf_counter() - start:.0f} s")
    finally:
        store.close()


def chosen(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> list[int]:
    """The queries: real task texts, by their index in ``pairs``."""
    return random.Random(args.seed).sample(range(len(pairs)), min(args.queries, len(pairs)))


def queries(args: argparse.Namespace, pairs: list[tuple[str, str]], base: np.ndarray) -> list[tuple[str, np.ndarray]]:
    return [(pairs[i][0], base[i]) for i in chosen(args, pairs)]


# ---------------------------------------------------------------- phase 0: where exact search stops being cheap


def exact_cost(args: argparse.Namespace) -> None:
    """Exact filtered top-5 at growing sizes against one query embedding, alternating: the size at which a store
    gets an index (settings.index_min_memories)."""
    embedder = MiniLMEmbedder()
    rng, prng = np.random.default_rng(args.seed), random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        store = EdgeStore(Path(root), B.DIM)
        try:
            stored = 0
            for size in args.exact_sizes:
                while stored < size:
                    vectors, _ = B.clustered_vectors(min(BATCH, size - stored), rng, clusters=50)
                    store.upsert(
                        "memories",
                        [
                            Point(
                                str(uuid.UUID(int=prng.getrandbits(128))), v, {**TINY, "namespace": B.NAMESPACES[i % 4]}
                            )
                            for i, v in enumerate(vectors)
                        ],
                    )
                    stored += len(vectors)
                search_ms, embed_ms = [], []
                for i in range(args.queries):
                    start = time.perf_counter()
                    embedder.embed([f"put a clean mug in the coffee machine, take {i}"])
                    embed_ms.append((time.perf_counter() - start) * 1000)
                    query = B.unit(rng.standard_normal((1, B.DIM)))[0]
                    start = time.perf_counter()
                    store.search(query, K, -1.0, {"namespace": B.NAMESPACES[0]}, exact=True)
                    search_ms.append((time.perf_counter() - start) * 1000)
                rows.append((size, B.p50(search_ms), B.p50(embed_ms), B.p50(search_ms) / B.p50(embed_ms)))
        finally:
            store.close()
    print(B.table(("memories", "exact p50 ms", "embedding p50 ms", "exact/embedding"), rows))


TINY = {"outcome": "success", "q": 0.0, "visits": 0}


# ---------------------------------------------------------------- phases 2 and 3: build, then HNSW vs exact


def during_build(args: argparse.Namespace, qs: list[tuple[str, np.ndarray]]) -> None:
    store = EdgeStore(store_dir(args), B.DIM, hnsw_ef=args.ef[0])
    try:
        ids = [point_id for (point_id, _), _ in zip(store.scroll("memories", fields=()), range(200), strict=False)]

        def write(i: int) -> None:  # a report's kind of write: conditional on the version it advances
            point_id = ids[i % len(ids)]
            version = int(store.get("memories", [point_id])[point_id].get("version", 0))
            store.set_payload_if("memories", point_id, {"version": version + 1}, {"version": version})

        def measure(until: threading.Event | None, rounds: int) -> tuple[list[float], list[tuple[float, float]]]:
            """Search and write in turn until ``until`` is set (or ``rounds`` times): search times (ms), and
            (start since the build's start in s, time in ms) of each write."""
            searches, writes = [], []
            i = 0
            while (until is not None and not until.is_set()) or (until is None and i < rounds):
                namespace, vector = qs[i % len(qs)]
                start = time.perf_counter()
                store.search(vector, K, -1.0, {"namespace": namespace})
                searches.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                write(i)
                writes.append((start - began, (time.perf_counter() - start) * 1000))
                i += 1
                time.sleep(args.pause)
            return searches, writes

        began = time.perf_counter()
        searches, writes = measure(None, len(qs))
        points, indexed = store.index_status()
        print(f"before the build ({points} memories, {indexed} of them indexed): search {summary(searches)} ms")
        print(f"                                               write  {summary([ms for _, ms in writes])} ms")
        done = threading.Event()

        def build() -> None:
            store.build_index(wait=True)
            done.set()

        with PeakRss() as peak:
            began = time.perf_counter()
            builder = threading.Thread(target=build)
            builder.start()
            searches, writes = measure(done, 0) if args.build_load == "searches" else ([], [])
            builder.join()
            build_s = time.perf_counter() - began
        times = store.last_build
        print(f"during the build ({args.build_load}, {build_s:.0f} s, {len(searches)} searches): {peak}")
        if times is not None:
            print(f"  the child's peak RSS: {peak.child_peaks(times.stream_s)}")
        if writes and times is not None:
            print(f"  search {summary(searches)} ms")
            print(f"  write  {summary([ms for _, ms in writes])} ms")
            steps = (("stream", times.stream_s), ("index", times.index_s), ("load", times.load_s), ("swap", 1e9))
            ends = np.cumsum([seconds for _, seconds in steps])
            slowest = sorted(writes, key=lambda write: -write[1])[:5]
            placed = [f"{ms:.0f} ms at {at:.0f} s ({steps[int(np.searchsorted(ends, at))][0]})" for at, ms in slowest]
            print(f"  slowest writes: {', '.join(placed)}")
        points, indexed = store.index_status()
        print(f"after the build: {indexed} of {points} memories indexed; {times}")
    finally:
        store.close()


def hnsw_vs_exact(args: argparse.Namespace, qs: list[tuple[str, np.ndarray]]) -> None:
    """Per query: exact search, then HNSW at each ef, alternating (same load); recall@5 from the first pass."""
    store = EdgeStore(store_dir(args), B.DIM)
    recall: dict[int, list[float]] = {ef: [] for ef in args.ef}
    hnsw_ms: dict[int, list[float]] = {ef: [] for ef in args.ef}
    exact_ms: list[float] = []
    try:
        for run in range(args.runs):
            for namespace, vector in qs:
                start = time.perf_counter()
                exact = store.search(vector, K, -1.0, {"namespace": namespace}, exact=True)
                if run:  # the first pass warms the caches; its times are not counted
                    exact_ms.append((time.perf_counter() - start) * 1000)
                for ef in args.ef:
                    start = time.perf_counter()
                    found = store.search(vector, K, -1.0, {"namespace": namespace}, hnsw_ef=ef)
                    if run:
                        hnsw_ms[ef].append((time.perf_counter() - start) * 1000)
                    else:
                        recall[ef].append(len({h.id for h in found} & {h.id for h in exact}) / max(len(exact), 1))
    finally:
        store.close()
    exact_p50 = B.p50(exact_ms)
    rows = []
    for ef in args.ef:
        hnsw_p50 = B.p50(hnsw_ms[ef])
        rows.append((ef, statistics.fmean(recall[ef]), min(recall[ef]), hnsw_p50, exact_p50, exact_p50 / hnsw_p50))
    headers = ("ef", f"recall@{K} mean", "min", "HNSW p50 ms", "exact p50 ms", "exact/HNSW")
    print(B.table(headers, rows))


# ---------------------------------------------------------------- phase 4: a fresh process


def read_through(folder: Path) -> None:
    """Read every file under ``folder`` once, so that the page cache holds it."""
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as stream:
                while stream.read(1 << 24):
                    pass


def fresh_process(args: argparse.Namespace) -> dict[str, Any]:
    """Run :func:`serve_child` in a new interpreter: start-up and RSS as a restarted server sees them."""
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--store",
            args.store,
            "--size",
            str(args.size),
            "--queries",
            str(args.queries),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def serve_child(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    settings = load_settings(data_dir=args.store, embedded_engine="edge")
    service = MemoryService.open(settings)
    open_s = time.perf_counter() - start
    opened = status_mb()
    stats_ms = B.timed_ms(lambda: service.stats(StatsQuery(), access=EVERYTHING), 5)
    texts = B.real_task_texts(B.shared_data_dir()) or {"default": ["open the drawer and take the key"]}
    pairs = [(ns, t) for ns, group in texts.items() for t in group]
    chosen = random.Random(1).sample(pairs, min(args.queries, len(pairs)))
    embedder = service.embedder
    recall_ms, embed_ms = [], []
    for namespace, task in chosen:
        start = time.perf_counter()
        embedder.embed([task + " "])  # a text the cache has not seen: the embedding a recall pays
        embed_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        service.recall(RecallQuery(task + " ", namespace), access=EVERYTHING)
        recall_ms.append((time.perf_counter() - start) * 1000)
    result = {
        "open_s": open_s,
        "stats_ms": B.p50(stats_ms),
        "stats_ms_first": stats_ms[0],
        "recall_ms": B.p50(recall_ms),
        "embed_ms": B.p50(embed_ms),
        "rss_open": opened,
        "rss_after": status_mb(),
        "memories": service.count(),
    }
    service.close()
    print(json.dumps(result))


# ---------------------------------------------------------------- phase 5: import


def import_throughput(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> None:
    rng = random.Random(args.seed)
    now = time.time()
    with tempfile.TemporaryDirectory() as root:
        export = Path(root) / "export.jsonl"
        tasks = []
        with export.open("w") as out:
            for i in range(args.import_size):
                namespace, text = pairs[i % len(pairs)]
                task = f"{text} #{i}"  # distinct tasks: the embedder's cache must not help
                tasks.append(task)
                payload = B.memory_payload(rng, namespace, task, now)
                memory = {key: payload[key] for key in ("namespace", "task", "experience", "outcome", "q", "visits")}
                memory |= {
                    key: payload[key] for key in ("last_reward", "merges", "created_at", "updated_at", "metadata")
                }
                out.write(json.dumps({"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), **memory}) + "\n")
        embedder = MiniLMEmbedder()
        start = time.perf_counter()
        for first in range(0, len(tasks), 64):
            embedder.embed(tasks[first : first + 64])
        embed_s = time.perf_counter() - start
        env = {**os.environ, "MEMRL_DATA_DIR": str(Path(root) / "data")}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "memrl_mcp.cli", "import", str(export)], env=env, capture_output=True, text=True
        )
        import_s = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
    n = args.import_size
    own = re.findall(r"records \(([0-9.]+)/s", done.stderr)  # the import's progress line: its rate after start-up
    print(
        f"import of {n} memories: {import_s:.1f} s ({n / import_s:.1f}/s with the process start, "
        f"{own[-1] if own else '?'}/s by its progress line); embedding the same tasks alone: {embed_s:.1f} s "
        f"({n / embed_s:.1f}/s); import/embedding {import_s / embed_s:.2f}x"
    )


# ---------------------------------------------------------------- phase 6: over MCP stdio


def server_env() -> dict[str, str]:
    """A spawned server's environment: this one without MEMRL_* settings, every tool, and no namespace quota (a
    benchmark namespace holds a quarter of the store, over the default 1 GB at 1M memories)."""
    own = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
    return own | {"MEMRL_TOOL_PROFILE": "full", "MEMRL_NAMESPACE_QUOTA_MB": "0"}


async def over_stdio(args: argparse.Namespace, qs: list[tuple[str, str]]) -> None:
    """recall_experience through a spawned server against (query embedding in this process + a round trip)."""
    embedder = MiniLMEmbedder()
    env = server_env()
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "memrl_mcp.cli", "--no-attach", "--data-dir", args.store], env=env
    )
    recall_ms, embed_ms, trip_ms = [], [], []
    async with Client(server) as client:
        for i, (namespace, task) in enumerate(qs):
            text = f"{task} "  # not in the embedder's cache, here or in the server
            start = time.perf_counter()
            embedder.embed([text])
            embed = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            await client.call_tool("memory_stats", {"namespace": namespace})
            trip = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            result = await client.call_tool("recall_experience", {"task": text, "namespace": namespace})
            recall = (time.perf_counter() - start) * 1000
            if result.is_error:
                raise RuntimeError(f"recall_experience failed: {result.content}")
            if i >= 5:  # warm-up
                recall_ms.append(recall)
                embed_ms.append(embed)
                trip_ms.append(trip)
    base = B.p50(embed_ms) + B.p50(trip_ms)
    print(
        f"over MCP stdio ({len(recall_ms)} queries): recall p50 {B.p50(recall_ms):.1f} ms (p95 "
        f"{B.pct(recall_ms, 95):.1f}); query embedding p50 {B.p50(embed_ms):.1f} ms + round trip (memory_stats) p50 "
        f"{B.p50(trip_ms):.1f} ms = {base:.1f} ms; recall / (embedding + round trip) {B.p50(recall_ms) / base:.2f}x"
    )


# ---------------------------------------------------------------- phase 7: start-up to the first answer


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3")


async def first_answer(args: argparse.Namespace, qs: list[tuple[str, str]]) -> None:
    """Spawn ``memrl-mcp`` on the store, time its first ``recall_experience`` answer from the spawn, read its peak
    RSS; ``--runs`` times, each with a new query."""
    env = server_env()
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "memrl_mcp.cli", "--no-attach", "--data-dir", args.store], env=env
    )
    for run in range(args.runs):
        namespace, task = qs[run % len(qs)]
        if args.cold:
            drop_page_cache()
        start = time.perf_counter()
        async with Client(server) as client:
            result = await client.call_tool("recall_experience", {"task": f"{task} ", "namespace": namespace})
            first = time.perf_counter() - start
            if result.is_error:
                raise RuntimeError(f"recall_experience failed: {result.content}")
            (pid,) = [pid for pid in children() if "memrl_mcp.cli" in Path(f"/proc/{pid}/cmdline").read_text()]
            memory = status_mb(pid)
        print(
            f"start-up to the first recall answer ({'page cache dropped' if args.cold else 'page cache as left'}): "
            f"{first:.2f} s; server RSS {memory['VmRSS']:.0f} MB (anon {memory['RssAnon']:.0f}, file "
            f"{memory['RssFile']:.0f}), peak {memory['VmHWM']:.0f} MB"
        )


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--store", default=None, help="Folder of the store (kept and reused; default: temporary).")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2, help="Passes over the queries (the first warms up).")
    parser.add_argument("--ef", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--pause", type=float, default=0.01, help="Seconds between two searches during the build.")
    parser.add_argument(
        "--build-load", choices=("searches", "idle"), default="searches", help="What runs beside the build (phase 2)."
    )
    parser.add_argument("--cold", action="store_true", help="Drop the page cache before each start (phase 7; root).")
    parser.add_argument("--import-size", type=int, default=20_000)
    parser.add_argument("--exact-sizes", type=int, nargs="+", default=[5000, 10_000, 20_000, 50_000])
    parser.add_argument("--phases", default="01234567", help="Which phases to run (digits).")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        serve_child(args)
        return
    temporary = None
    if args.store is None:
        temporary = tempfile.TemporaryDirectory()
        args.store = temporary.name
    print(f"perf/scale.py: {args.size} memories, {args.queries} queries; {B.machine()}")
    embedder = MiniLMEmbedder()
    pairs, base, source = corpus(embedder, args.seed, B.shared_data_dir())
    print(f"texts: {source}")
    qs = queries(args, pairs, base)
    if "0" in args.phases:
        exact_cost(args)
    if "1" in args.phases:
        preload(args, pairs, base)
    if "2" in args.phases:
        during_build(args, qs)
    if "3" in args.phases:
        hnsw_vs_exact(args, qs)
    if "4" in args.phases:
        # The first open of a store filled outside the service also checks its schema (once, then recorded). The
        # third reads the store's files first: a machine whose page cache still holds them (this VM's reclaims
        # file pages a minute after their last use, so the others read the store from disk).
        for which in ("first open", "second open", "third open, store in the page cache"):
            if "page cache" in which:
                read_through(Path(args.store))
            child = fresh_process(args)
            print(
                f"fresh process, {which}: open {child['open_s']:.2f} s (store + service + model), "
                f"{child['memories']} memories; memory_stats p50 {child['stats_ms']:.1f} ms (first "
                f"{child['stats_ms_first']:.1f}); recall p50 {child['recall_ms']:.1f} ms vs query embedding "
                f"{child['embed_ms']:.1f} ms ({child['recall_ms'] / child['embed_ms']:.2f}x)"
            )
            for moment in ("rss_open", "rss_after"):
                fields = child[moment]
                print(
                    f"  RSS {moment[4:]}: {fields['VmRSS']:.0f} MB (anon {fields['RssAnon']:.0f}, "
                    f"file {fields['RssFile']:.0f}), peak {fields['VmHWM']:.0f} MB"
                )
    if "5" in args.phases:
        import_throughput(args, pairs)
    if "6" in args.phases:
        asyncio.run(over_stdio(args, [pairs[i] for i in chosen(args, pairs)]))
    if "7" in args.phases:
        asyncio.run(first_answer(args, [pairs[i] for i in chosen(args, pairs)]))
    if temporary is not None:
        temporary.cleanup()


if __name__ == "__main__":
    main()
