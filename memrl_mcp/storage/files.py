"""Durable file writes shared by backups and the embedded store's own bookkeeping files."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")


def write_atomically(path: Path, write: Callable[[BinaryIO], T]) -> T:
    """Write through a synced temporary file renamed over ``path``, so ``path`` is either untouched or complete.
    The file is readable by its owner only: memories may hold secrets."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as stream:
            result = write(stream)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        os.unlink(temporary)
        raise
    os.replace(temporary, path)
    sync_folder(path.parent)  # make the rename itself durable
    return result


def sync_folder(folder: Path) -> None:
    """Make the creations, renames and removals of entries of ``folder`` durable."""
    if os.name == "posix":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
