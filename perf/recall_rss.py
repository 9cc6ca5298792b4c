"""Resident memory of pending recalls: how much RAM a store holding N unreported recalls costs (a benchmark).

A recall that is never reported stays in the ``recalls`` table until it expires. This script writes N recall
points (the payload the service writes: namespace, task text, memory ids, twins, status, times; a 384-d query
vector) into a fresh embedded store, then measures, each in a fresh child process, the resident memory of a
process that opens that store: right after the open (what a restarted server carries) and after writing them
(what a running server carries). Figures are from ``/proc/self/status``: ``RssAnon`` (heap: the engine's RAM
structures) and ``RssFile`` (mapped store files the kernel may drop at will).

    .venv/bin/python perf/recall_rss.py --recalls 50000
    .venv/bin/python perf/recall_rss.py --recalls 50000 --memories 10000 --engine qdrant-local
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import DIM, NAMESPACES, clustered_vectors, synthetic_text, table

from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, Table, open_store

BATCH = 500
TABLES: tuple[Table, ...] = ("recalls", "memories")


class Rss(TypedDict):
    """What a child process measured: its RSS (:func:`rss_kb`) at each step, and the recalls its store held."""

    before: dict[str, int]
    opened: dict[str, int]
    written: dict[str, int]
    recalls: int


def rss_kb() -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of this process, in KB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0])
    return fields


def recall_points(rng: random.Random, vectors: np.ndarray, start: int) -> list[Point]:
    now = time.time()
    return [
        Point(
            str(uuid.UUID(int=rng.getrandbits(128))),
            vector,
            {
                "namespace": NAMESPACES[(start + i) % len(NAMESPACES)],
                "task": synthetic_text(rng, 200),
                "memory_ids": [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(3)],
                "twins": {"success": str(uuid.UUID(int=rng.getrandbits(128)))},
                "status": "pending",
                "created_at": now,
                "expires_at": now + 7 * 24 * 3600.0,
            },
        )
        for i, vector in enumerate(vectors)
    ]


def child(data_dir: Path, engine: str, recalls: int, memories: int) -> Rss:
    """Open the store (writing ``recalls`` recalls and ``memories`` memories first if asked); RSS at each step."""
    settings = load_settings(data_dir=data_dir, embedded_engine=engine)
    before = rss_kb()
    store = open_store(settings.storage, DIM)
    opened = rss_kb()
    rng = random.Random(0)
    for table_name, count in zip(TABLES, (recalls, memories), strict=True):
        for start in range(0, count, BATCH):
            vectors, _ = clustered_vectors(min(BATCH, count - start), np.random.default_rng(start), clusters=50)
            store.upsert(table_name, recall_points(rng, vectors, start))
    written = rss_kb()
    pending = store.count("recalls")
    store.close()
    return {"before": before, "opened": opened, "written": written, "recalls": pending}


def run_child(data_dir: Path, engine: str, recalls: int, memories: int) -> Rss:
    args = [sys.executable, __file__, "--child", str(data_dir), "--engine", engine]
    args += ["--recalls", str(recalls), "--memories", str(memories)]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recalls", type=int, default=50_000)
    parser.add_argument("--memories", type=int, default=0, help="Memories written too (same payload shape).")
    parser.add_argument("--engine", choices=("edge", "qdrant-local"), default="edge")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.engine, args.recalls, args.memories)))
        return
    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder)
        empty = run_child(data_dir / "empty", args.engine, 0, 0)
        written = run_child(data_dir / "full", args.engine, args.recalls, args.memories)
        reopened = run_child(data_dir / "full", args.engine, 0, 0)
        size_mb = sum(f.stat().st_blocks * 512 for f in (data_dir / "full").rglob("*") if f.is_file()) / 1e6
    rows = []
    steps: list[tuple[str, Rss, Literal["opened", "written"]]] = [
        ("empty store, opened", empty, "opened"),
        (f"{args.recalls} recalls written", written, "written"),
        ("same store, reopened", reopened, "opened"),
    ]
    for label, result, step in steps:
        rss = result[step]
        base = result["before"]
        rows.append((label, rss["VmRSS"] // 1024, (rss["RssAnon"] - base["RssAnon"]) // 1024, rss["RssFile"] // 1024))
    pending = reopened["recalls"]
    print(f"engine {args.engine}, {pending} recalls pending, {args.memories} memories, {size_mb:.1f} MB on disk")
    print(table(("step", "VmRSS MB", "RssAnon added MB", "RssFile MB"), rows))


if __name__ == "__main__":
    main()
