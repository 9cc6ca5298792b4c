"""The room a store of N memories needs to open (issue 31), on the filesystem of ``--folder``.

qdrant-edge maps its files into memory; on tmpfs a mapped hole is allocated as the engine reads it, and an open
loads its payload indexes and the vectors it holds in RAM whole. For each N, a store of N memories (the service's
payloads, ~300-character experiences, random unit vectors; every table made) is written and closed under
``--folder``; then it is opened and closed again, and the space its files take is compared before and after.

Printed per N: the store on disk after its close (``allocated``), what the reopen allocated besides (``room``),
what the server's check counts before opening it (``estimate``: ``memrl_mcp.storage.disk.filled_at_open``), and
the free space a writable open therefore asks, ``estimate`` plus ``min_free_disk_mb``. On a disk filesystem the room
is a few KB (a hole read is not allocated); mount a tmpfs to see it (root):

    mount -t tmpfs -o size=2g tmpfs /mnt/t && .venv/bin/python perf/open_room.py --folder /mnt/t
    .venv/bin/python perf/open_room.py --memories 0 50                   # a tiny run (tests), on TMPDIR
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B

from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, open_store
from memrl_mcp.storage.disk import filled_at_open
from memrl_mcp.storage.files import allocated_bytes

MB = 1 << 20
BATCH = 1000


def write_store(data_dir: Path, memories: int, seed: int) -> Path:
    """A closed store of ``memories`` memories; returns its engine folder."""
    settings = load_settings(data_dir=data_dir)
    store = open_store(settings.storage, B.DIM)
    rng, vectors = random.Random(seed), np.random.default_rng(seed)
    try:
        for start in range(0, memories, BATCH):
            count = min(BATCH, memories - start)
            rows = B.unit(vectors.standard_normal((count, B.DIM)).astype(np.float32))
            ids = [str(uuid.UUID(int=start + i + 1, version=4)) for i in range(count)]
            payloads = [B.memory_payload(rng, "ns", f"task {start + i}", 1.7e9) for i in range(count)]
            store.upsert("memories", [Point(*point) for point in zip(ids, rows, payloads, strict=True)])
    finally:
        store.close()
    return data_dir / settings.storage.collection / "edge"


def measure(folder: Path, memories: int, min_free_mb: int) -> list[object]:
    with tempfile.TemporaryDirectory(dir=folder, prefix="memrl-open-room-") as scratch:
        data_dir = Path(scratch) / "data"
        store_folder = write_store(data_dir, memories, seed=memories)
        before = allocated_bytes(store_folder)
        tables = [path for path in store_folder.iterdir() if (path / "edge_config.json").exists()]
        estimate = sum(filled_at_open(table) for table in tables)
        start = time.perf_counter()
        open_store(load_settings(data_dir=data_dir).storage, B.DIM).close()
        seconds = time.perf_counter() - start
        room = allocated_bytes(store_folder) - before
    return [memories, before / MB, room / MB, estimate / MB, estimate / MB + min_free_mb, seconds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--memories", type=int, nargs="+", default=[0, 1000, 10_000, 30_000])
    parser.add_argument("--min-free-mb", type=int, default=64, help="min_free_disk_mb, added to the estimate")
    args = parser.parse_args()
    print(B.machine())
    rows = [measure(args.folder, n, args.min_free_mb) for n in args.memories]
    headers = ["memories", "allocated MB", "room MB", "estimate MB", "asks MB free", "open s"]
    print(B.table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
