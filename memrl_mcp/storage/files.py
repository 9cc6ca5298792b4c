"""Durable file writes shared by backups and the embedded store's own bookkeeping files, and the sparse-aware
copies and disk-space figures of the store's folder."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")
COPY_CHUNK = 1 << 20


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


def copy_sparse(source: Path, target: Path) -> None:
    """Copy the folder tree ``source`` to ``target`` (which must not exist), keeping the holes of sparse files:
    qdrant-edge preallocates its write-ahead log and page files as 32 MB files that are mostly holes (an empty store
    is almost all holes), which a plain copy would write out in full."""
    target.mkdir()
    for entry in os.scandir(source):
        destination = target / entry.name
        if entry.is_dir(follow_symlinks=False):
            copy_sparse(Path(entry.path), destination)
        elif entry.is_file(follow_symlinks=False):
            _copy_file_sparse(Path(entry.path), destination)


def _copy_file_sparse(source: Path, target: Path) -> None:
    with source.open("rb") as src, target.open("wb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
                end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            except OSError as error:
                if error.errno == errno.ENXIO:  # no data after offset: the rest is a hole
                    break
                start, end = offset, size  # a filesystem without SEEK_DATA: copy it all
            src.seek(start)
            dst.seek(start)
            left = end - start
            while left > 0:
                chunk = src.read(min(left, COPY_CHUNK))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)
            offset = end
        dst.truncate(size)


def allocated_bytes(folder: Path) -> int:
    """Disk space the files under ``folder`` take (their allocated blocks, holes not counted)."""
    return sum(path.lstat().st_blocks * 512 for path in _files(folder))


def hole_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` that are holes: what mapping and filling them could still allocate."""
    return sum(max(0, stat.st_size - stat.st_blocks * 512) for stat in (path.lstat() for path in _files(folder)))


def free_bytes(folder: Path) -> int:
    """Free space for an unprivileged writer on the filesystem holding ``folder``."""
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def _files(folder: Path) -> Iterator[Path]:
    if folder.is_dir():
        yield from (path for path in folder.rglob("*") if path.is_file() and not path.is_symlink())
