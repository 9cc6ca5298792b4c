"""The free disk an embedded store needs, checked before each write.

qdrant-edge writes through memory-mapped files, and a page it cannot allocate kills the process with SIGBUS instead of
an error: an embedded store refuses writes before its disk is too full for the engine. Deletes are always allowed
(they free room); reads never need room.
"""

from __future__ import annotations

import os
from pathlib import Path

from memrl_mcp.errors import MemrlError

MB = 1 << 20


class DiskFullError(MemrlError):
    """A write was refused: the disk under the embedded store has less free space than ``min_free_disk_mb``."""


class DiskRoom:
    """The free space a write needs under an embedded store's folder, checked before each write.

    One ``statvfs`` per write (3.5 us measured, against 100 us and more for the write itself) keeps the check
    exact without a cache that a burst of writes could outrun. A new recall may use half of the margin that new
    memories and updates may not: recall keeps answering on a nearly full disk, and the other half stays for the
    engine's own growth (WAL pages, a reopen)."""

    def __init__(self, path: Path, min_free_mb: int) -> None:
        self._path = path
        self._min_free = min_free_mb * MB

    def check(self, share: float = 1.0) -> None:
        """Raise :class:`DiskFullError` unless ``share`` of the margin is still free."""
        if self._min_free == 0:
            return
        stats = os.statvfs(self._path)
        free = stats.f_bavail * stats.f_frsize
        if free < self._min_free * share:
            raise DiskFullError(
                f"the disk holding the memory store ({self._path}) has {free / MB:.1f} MB free, below "
                f"min_free_disk_mb={self._min_free // MB}: writes are refused until space is freed (recall, "
                "stats and export still work; forgetting memories is allowed)"
            )


RECALL_SHARE = 0.5  # of the free-space margin, that a new recall may use
