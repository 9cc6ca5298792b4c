"""The free disk an embedded store needs, checked before each write.

qdrant-edge writes through memory-mapped files, and a page it cannot allocate kills the process with SIGBUS instead of
an error: an embedded store refuses writes before its disk is too full for the engine. Deletes are always allowed
(they free room); reads never need room. An open that could run out of room is tried in a child process first
(:meth:`DiskRoom.check_open`).
"""

from __future__ import annotations

import fcntl
import json
import math
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from memrl_mcp.errors import MemrlError
from memrl_mcp.storage.files import flocked, free_bytes, give_back, hole_bytes, holes

MB = 1 << 20


class DiskFullError(MemrlError):
    """A write was refused: the disk under the embedded store has less free space than ``min_free_disk_mb``."""


class DiskRoom:
    """The free space a write needs under an embedded store's folder, checked before each write.

    One ``statvfs`` per write, cheap against the write itself (docs/performance.md), keeps the check
    exact without a cache that a burst of writes could outrun. A new recall may use half of the margin that new
    memories and updates may not: recall keeps answering on a nearly full disk, and the other half stays for the
    engine's own growth (WAL pages, a reopen)."""

    def __init__(self, path: Path, min_free_mb: int) -> None:
        self._path = path
        self._min_free = min_free_mb * MB

    @property
    def min_free(self) -> int:
        """The margin, in bytes."""
        return self._min_free

    def check(self, share: float = 1.0) -> None:
        """Raise :class:`DiskFullError` unless ``share`` of the margin is still free."""
        if self._min_free == 0:
            return
        free = free_bytes(self._path)  # a statvfs at every write (its cost: perf/write_costs.py)
        if free < self._min_free * share:
            raise DiskFullError(
                f"the disk holding the memory store ({self._path}) has {free / MB:.1f} MB free, below "
                f"min_free_disk_mb={self._min_free // MB}: writes are refused until space is freed (recall, "
                "stats and export still work; forgetting memories is allowed)"
            )

    def check_open(self, folders: Sequence[Path]) -> None:
        """Before this process opens the shards in ``folders``: make sure opening them cannot kill it.

        qdrant-edge maps its files into memory, and on tmpfs it allocates their holes as it opens them (a small
        store's first reopen can take many times its size); a page it cannot allocate kills the process with SIGBUS,
        where no error can be caught. When the free space could not cover every hole of the store's files plus
        the margin, a child process opens the shards first: if it lives, what it allocated stays allocated and this
        process's open needs no more; if it dies of SIGBUS, the pages it allocated and left empty are given back
        (a refused start takes no room), and the room the store needs is said (:func:`filled_at_open`)."""
        free = free_bytes(self._path)
        if free >= sum(hole_bytes(folder) for folder in folders) + self._min_free:
            return
        former = {path: ranges for folder in folders for path, ranges in holes(folder).items()}
        probe = "import sys, qdrant_edge as e\nfor p in sys.argv[1:]: e.EdgeShard.load(p).close()"
        done = subprocess.run(
            [sys.executable, "-c", probe, *map(str, folders)], stdin=subprocess.DEVNULL, capture_output=True
        )
        if done.returncode == -signal.SIGBUS:
            logs = [folder / "wal" for folder in folders if (folder / "wal").is_dir()]
            with flocked(logs, fcntl.LOCK_EX) as busy:
                if busy is None:  # else another process opened the store meanwhile: its pages are its own
                    give_back(former)
            need = math.ceil((sum(filled_at_open(folder) for folder in folders) + self._min_free) / MB)
            raise DiskFullError(
                f"cannot open the memory store at {self._path}: its disk has {free / MB:.1f} MB free, too little "
                "for the engine to map its files (a process opening it died of SIGBUS). What that process took was "
                f"given back; opening it writable needs about {need} MB free: its indexes and the vectors it "
                "holds in RAM, which this filesystem allocates as the engine maps them, and "
                f"min_free_disk_mb={self._min_free // MB} for its writes. Free some space; meanwhile a read-only "
                "server (MEMRL_TOOL_PROFILE=read_only) serves it and `memrl-mcp export` backs it up: both open a copy "
                "of it in TMPDIR"
            )


def filled_at_open(shard: Path) -> int:
    """The bytes an open of the qdrant-edge shard at ``shard`` allocates on a filesystem that allocates the mapped
    holes of a file (tmpfs): the holes of its payload indexes (an appendable segment loads them whole) and of the
    vectors it holds in RAM (a segment whose vector storage is not memory-mapped, read on demand)."""
    filled = 0
    for described in (shard / "segments").glob("*/segment.json"):
        segment = described.parent
        filled += hole_bytes(segment / "payload_index")
        config = json.loads(described.read_text())["config"]["vector_data"]
        if any(str(vectors.get("storage_type", "")).startswith("InRam") for vectors in config.values()):
            filled += hole_bytes(segment / "vector_storage")
    return filled


RECALL_SHARE = 0.5  # of the free-space margin, that a new recall may use
