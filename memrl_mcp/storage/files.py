"""Durable file writes shared by backups and the embedded store's own bookkeeping files, and the sparse-aware
copies and disk-space figures of the store's folder."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")
COPY_CHUNK = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
ZERO_PAGE = bytes(PAGE)
PUNCH_HOLE = 0x02 | 0x01  # Linux fallocate: FALLOC_FL_PUNCH_HOLE, which requires FALLOC_FL_KEEP_SIZE


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
    is almost all holes), which a plain copy would write out in full. The copy is private (folders 0700, files
    0600), whatever the umask: it holds every memory of the store."""
    target.mkdir(mode=0o700)
    for entry in os.scandir(source):
        destination = target / entry.name
        if entry.is_dir(follow_symlinks=False):
            copy_sparse(Path(entry.path), destination)
        elif entry.is_file(follow_symlinks=False):
            _copy_file_sparse(Path(entry.path), destination)


def _copy_file_sparse(source: Path, target: Path) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
        size = os.fstat(src.fileno()).st_size
        for start, end in _extents(src.fileno(), 0, size):
            src.seek(start)
            dst.seek(start)
            left = end - start
            while left > 0:
                chunk = src.read(min(left, COPY_CHUNK))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)
        dst.truncate(size)


def _extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of ``[start, end)`` of the open file ``fd`` that hold data, in order (on a filesystem without
    SEEK_DATA: all of it)."""
    offset = start
    while offset < end:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: no data after offset, the rest is a hole
                yield offset, end
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        offset = hole


def holes(folder: Path) -> dict[Path, list[tuple[int, int]]]:
    """The holes of the files under ``folder``: per file, the ranges that hold no data."""
    found: dict[Path, list[tuple[int, int]]] = {}
    for path in _files(folder):
        with path.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            edges = [0, *(edge for extent in _extents(stream.fileno(), 0, size) for edge in extent), size]
        found[path] = [(start, end) for start, end in zip(edges[::2], edges[1::2], strict=True) if end > start]
    return found


def give_back(former_holes: dict[Path, list[tuple[int, int]]]) -> int:
    """Punch back the pages of these former holes that hold only zeros now, and return their bytes. A process that
    mapped a file's holes on tmpfs and died left their pages allocated and empty: the files read the same after, and
    the room is free again; a page it wrote data to is kept."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    freed = 0
    for path, ranges in former_holes.items():
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            for start, end in ranges:
                for offset, stop in _extents(fd, start, end):
                    for zeros, length in _zero_pages(fd, offset, stop):
                        if libc.fallocate(fd, PUNCH_HOLE, zeros, length) == 0:
                            freed += length
        finally:
            os.close(fd)
    return freed


def _zero_pages(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The runs of whole pages of ``[start, end)`` (page-aligned) that read as zeros: (offset, length)."""
    run = start
    for offset in range(start, end, COPY_CHUNK):
        chunk = memoryview(os.pread(fd, min(COPY_CHUNK, end - offset), offset))
        for page in range(0, len(chunk), PAGE):
            if chunk[page : page + PAGE] != ZERO_PAGE[: len(chunk) - page]:
                if offset + page > run:
                    yield run, offset + page - run
                run = offset + page + PAGE
    if end > run:
        yield run, end - run


def allocated_bytes(folder: Path) -> int:
    """Disk space the files under ``folder`` take (their allocated blocks, holes not counted)."""
    return sum(path.lstat().st_blocks * 512 for path in _files(folder))


def hole_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` that are holes: what mapping and filling them could still allocate."""
    return sum(max(0, stat.st_size - stat.st_blocks * 512) for stat in (path.lstat() for path in _files(folder)))


@contextmanager
def flocked(paths: Sequence[Path], operation: int) -> Iterator[Path | None]:
    """Hold ``operation`` (``fcntl.LOCK_SH`` or ``LOCK_EX``) on each of ``paths`` without waiting for it: yields
    None once all are held, else the first one another process holds (and then holds none)."""
    held: list[int] = []
    try:
        for path in paths:
            held.append(os.open(path, os.O_RDONLY))
            try:
                fcntl.flock(held[-1], operation | fcntl.LOCK_NB)
            except BlockingIOError:
                for fd in held:
                    os.close(fd)
                held.clear()
                yield path
                return
        yield None
    finally:
        for fd in held:
            os.close(fd)


def free_bytes(folder: Path) -> int:
    """Free space for an unprivileged writer on the filesystem holding ``folder``."""
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def _files(folder: Path) -> Iterator[Path]:
    if folder.is_dir():
        yield from (path for path in folder.rglob("*") if path.is_file() and not path.is_symlink())
