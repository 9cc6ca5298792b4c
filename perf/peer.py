"""Against the official Qdrant MCP server: our recall_experience against its qdrant-find (a benchmark, not a test).

Both servers run as stdio processes, driven by one MCP client that alternates query by query (ours, then the
peer's, on the same task text), so both see the same machine load; the ratio is taken per size and query
length over the same queries.

- Ours: ``python -m memrl_mcp.cli`` on the default embedded engine (qdrant-edge) and the default embedder.
- The peer: ``mcp-server-qdrant`` (0.8.1 when last compared), installed in a virtualenv of its own (``--peer``, its
  console script), on a local-path Qdrant (``QDRANT_LOCAL_PATH``: qdrant-client's local mode, its embedded
  option) with FastEmbed's all-MiniLM-L6-v2, fp32, and ``QDRANT_SEARCH_LIMIT`` = our k1. FastEmbed cannot
  download here: the fp32 model is rebuilt from the published weights (``memrl_mcp.embeddings.minilm_build``) into the
  folder where FastEmbed finds an earlier download (``FASTEMBED_CACHE_PATH``/``fast-all-MiniLM-L6-v2``, with
  ``HF_HUB_OFFLINE=1``). The peer's code runs unmodified.

Both stores hold the same N memories in one namespace (the peer has none: both search all N): perturbed copies
of the embeddings of the real task texts (``latency.py``'s corpus), ours with the service's payload, the peer's
with its own (``document``, ``metadata``) under its vector name. Queries are real task texts, by length:
short (ALFWorld goals, LifelongAgentBench instructions) and long (300-character BigCodeBench prompts).

    /work/main/.venv/bin/python perf/peer.py --sizes 1000,10000,100000 --queries 100 \\
        --peer /work/peer-venv/bin/mcp-server-qdrant

``--compare-threads 1`` runs a second server of ours beside the first, with that many threads per model run
(``embedding_threads``) on a copy of the same store, timed on the same queries (the two in alternating order):
the threads' effect, paired under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B
import latency

from memrl_mcp.embeddings import MiniLMEmbedder, minilm_build
from memrl_mcp.settings import load_settings

COLLECTION = "bench"
PEER_VECTOR = "fast-all-minilm-l6-v2"  # the vector name mcp-server-qdrant gives FastEmbed's MiniLM
NAMESPACE = "bench"
K1 = 5
WARMUP = 5


def fastembed_cache(root: Path) -> Path:
    """A FastEmbed cache holding all-MiniLM-L6-v2 fp32 as an earlier download would have left it."""
    folder = root / "fast-all-MiniLM-L6-v2"
    if not (folder / "model.onnx").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            built = minilm_build.build(Path(tmp), keep_fp32=True)
            folder.mkdir(parents=True, exist_ok=True)
            for name in minilm_build.SIDE_FILES:
                shutil.copyfile(built / name, folder / name)
            shutil.copyfile(built / "model_fp32.onnx", folder / "model.onnx")
    return root


def fill_peer(path: Path, points: list) -> float:
    """The peer's collection, as its qdrant-store would write it (payload ``document``, ``metadata``)."""
    from qdrant_client import QdrantClient, models

    start = time.perf_counter()
    client = QdrantClient(path=str(path))
    vectors = {PEER_VECTOR: models.VectorParams(size=B.DIM, distance=models.Distance.COSINE)}
    client.create_collection(COLLECTION, vectors_config=vectors)
    for i in range(0, len(points), latency.BATCH):
        batch = [
            models.PointStruct(id=p.id, vector={PEER_VECTOR: p.vector.tolist()}, payload=peer_payload(p.payload))
            for p in points[i : i + latency.BATCH]
        ]
        client.upsert(COLLECTION, batch)
    client.close()
    return time.perf_counter() - start


def peer_payload(ours: dict) -> dict:
    return {"document": ours["task"], "metadata": None}


async def timed(client: Client, tool: str, arguments: dict) -> float:
    start = time.perf_counter()
    result = await client.call_tool(tool, arguments)
    elapsed = (time.perf_counter() - start) * 1000
    if result.is_error:
        raise RuntimeError(f"{tool} failed: {result.content}")
    return elapsed


def our_server(data_dir: Path, env: dict[str, str]) -> StdioServerParameters:
    args = ["-m", "memrl_mcp.cli", "--no-attach", "--data-dir", str(data_dir)]
    return StdioServerParameters(command=sys.executable, args=args, env=env)


async def recall(client: Client, text: str) -> float:
    return await timed(client, "recall_experience", {"task": text, "namespace": NAMESPACE, "k1": K1})


async def run_size(n: int, args, pairs, base, queries: dict[str, list[str]], root: Path, cache: Path) -> list:
    points, _ = latency.memories(n, pairs, base, args.seed + n)
    for point in points:
        point.payload["namespace"] = NAMESPACE
    ours_dir, other_dir, peer_dir = root / f"ours{n}", root / f"other{n}", root / f"peer{n}"
    ours_s = latency.prefill(load_settings(data_dir=ours_dir, embedded_engine="edge"), points)
    if args.compare_threads:
        latency.prefill(load_settings(data_dir=other_dir, embedded_engine="edge"), points)
    peer_s = fill_peer(peer_dir, points)
    del points
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMRL_", "QDRANT_", "COLLECTION_"))}
    ours = our_server(ours_dir, env)
    other = our_server(other_dir, env | {"MEMRL_EMBEDDING_THREADS": str(args.compare_threads)})
    peer_env = env | {
        "QDRANT_LOCAL_PATH": str(peer_dir),
        "COLLECTION_NAME": COLLECTION,
        "QDRANT_SEARCH_LIMIT": str(K1),
        "FASTEMBED_CACHE_PATH": str(cache),
        "HF_HUB_OFFLINE": "1",
    }
    peer = StdioServerParameters(command=args.peer, args=[], env=peer_env)
    rows = []
    async with Client(ours) as our_client, Client(peer) as peer_client, AsyncExitStack() as stack:
        other_client = await stack.enter_async_context(Client(other)) if args.compare_threads else None
        print(f"  N={n}: our store filled in {ours_s:.1f} s, the peer's in {peer_s:.1f} s", flush=True)
        sides = [our_client, other_client] if other_client else [our_client]
        for length, texts in queries.items():
            times: list[list[float]] = [[] for _ in sides]
            finds = []
            for i, text in enumerate(texts):
                order = range(len(sides)) if i % 2 else reversed(range(len(sides)))
                took = {side: await recall(sides[side], text) for side in order}
                found = await timed(peer_client, "qdrant-find", {"query": text})
                if i >= WARMUP:
                    for side, timings in enumerate(times):
                        timings.append(took[side])
                    finds.append(found)
            row = Row(n, length, times[0], finds, times[1] if other_client else None)
            rows.append(row)
            shown = f" ({args.compare_threads} thread(s): {B.p50(row.others):.1f} ms)" if row.others else ""
            our_p50 = B.p50(row.recalls)
            print(f"    {length} queries: our recall p50 {our_p50:.1f} ms{shown}, the peer's find {row.find:.1f} ms")
    return rows


@dataclass(frozen=True)
class Row:
    """One size and query length: our recall's times, the peer's find's, and the compared server's (if any)."""

    n: int
    length: str
    recalls: list[float]
    finds: list[float]
    others: list[float] | None

    @property
    def find(self) -> float:
        return B.p50(self.finds)

    def cells(self) -> tuple:
        ours = (self.n, self.length, B.p50(self.recalls), B.pct(self.recalls, 95), self.find, B.pct(self.finds, 95))
        compared = (B.p50(self.others), B.p50(self.others) / self.find) if self.others is not None else ()
        return (*ours, B.p50(self.recalls) / self.find, *compared)


async def main_async(args) -> int:
    embedder = MiniLMEmbedder()
    pairs, base, source = latency.corpus(embedder, args.seed, B.shared_data_dir())
    rng = random.Random(args.seed)
    short = [t for ns, t in pairs if ns != "bigcodebench"]
    long = [t for ns, t in pairs if ns == "bigcodebench"]
    if not long:  # synthetic texts: split by length instead
        long = [t for t in short if len(t) > 120]
        short = [t for t in short if len(t) <= 120]
    queries = {
        "short": [rng.choice(short) for _ in range(args.queries + WARMUP)],
        "long": [rng.choice(long) for _ in range(args.queries + WARMUP)],
    }
    print(f"peer: {B.machine()}; vectors: {source}; peer: {args.peer}")
    mean_chars = {k: sum(map(len, v)) / len(v) for k, v in queries.items()}
    print(f"  queries per size and length: {args.queries} (+{WARMUP} warm-up); mean characters {mean_chars}")
    cache = fastembed_cache(Path(tempfile.gettempdir()) / "memrl-bench-cache" / "fastembed")
    rows = []
    with tempfile.TemporaryDirectory(prefix="memrl-peer-") as tmp:
        for n in args.sizes:
            rows += await run_size(n, args, pairs, base, queries, Path(tmp), cache)
    print()
    headers = ["N", "query", "our recall p50 ms", "p95", "peer find p50 ms", "p95", "recall / find"]
    if args.compare_threads:
        headers += [f"{args.compare_threads} thread(s): recall p50 ms", "/ find"]
    print(B.table(headers, [row.cells() for row in rows]))
    behind = [row for row in rows if B.p50(row.recalls) >= row.find]
    print(f"\nour recall p50 below the peer's find p50: {len(rows) - len(behind)} of {len(rows)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10000, 100000])
    parser.add_argument("--queries", type=int, default=100, help="timed queries per size and query length")
    parser.add_argument("--peer", default=shutil.which("mcp-server-qdrant"), help="the peer's console script")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-threads", type=int, help="also time a server of ours with this embedding_threads")
    args = parser.parse_args()
    if not args.peer or not Path(args.peer).is_file():
        raise SystemExit("mcp-server-qdrant not found: pip install mcp-server-qdrant==0.8.1 into a venv, pass --peer")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
