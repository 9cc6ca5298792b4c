"""Opening the store the settings name: a Qdrant server, or an embedded engine under ``data_dir`` made private to
its user (:mod:`~memrl_mcp.storage.private`) with its usage metered for quotas, or, read-only, a private copy of it
that nothing writes back."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memrl_mcp.settings import StorageSettings
from memrl_mcp.storage.disk import MB, DiskFullError, DiskRoom
from memrl_mcp.storage.edge import EdgeStore
from memrl_mcp.storage.files import allocated_bytes, copy_sparse, flocked, free_bytes
from memrl_mcp.storage.layers import ReadOnlyStore
from memrl_mcp.storage.private import make_private
from memrl_mcp.storage.qdrant import QdrantClientStore
from memrl_mcp.storage.store import Store, StoreLockedError, StoreNotWritableError

ENGINE_FOLDERS = {"edge": "edge", "qdrant-local": "qdrant-local"}


def open_store(settings: StorageSettings, dim: int, read_only: bool = False) -> Store:
    """The store the settings ask for: a Qdrant server if a URL is set, else an embedded engine, whose usage per
    namespace is measured (:class:`~memrl_mcp.storage.quota.MeteredStore`); ``read_only``: a store that refuses
    every write (:class:`~memrl_mcp.storage.layers.ReadOnlyStore`), an embedded one opened from a private copy.
    An embedded store is made private to this user before its engine opens it, or refused if it cannot be
    (:func:`~memrl_mcp.storage.private.make_private`)."""
    if settings.qdrant_url:
        api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        server = QdrantClientStore(
            dim, settings.collection, url=settings.qdrant_url, api_key=api_key, create=not read_only
        )
        return ReadOnlyStore(server) if read_only else server
    folder = settings.data_dir / settings.collection / ENGINE_FOLDERS[settings.embedded_engine]
    if not read_only:
        existing = next(path for path in (folder, *folder.parents) if path.exists())
        if not os.access(existing, os.W_OK):
            raise StoreNotWritableError(
                f"the memory store at {folder} cannot be written ({existing} is read-only to this process): serve "
                "it read-only (MEMRL_TOOL_PROFILE=read_only), which reads a copy, or move it to a writable folder"
            )
        make_private(settings.data_dir, folder)
        from memrl_mcp.storage.quota import MeteredStore  # a layer over the stores of this package

        store = _embedded(settings, folder, dim)
        try:
            return MeteredStore(store, folder, dim, keeps_replaced=settings.embedded_engine == "edge")
        except BaseException:
            store.close()
            raise
    make_private(settings.data_dir, folder, read_only=True)
    scratch = private_copy(folder, settings.min_free_disk_mb)
    try:
        return ReadOnlyStore(_embedded(settings, scratch / folder.name, dim, index_min=0), scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _embedded(settings: StorageSettings, folder: Path, dim: int, index_min: int | None = None) -> Store:
    room = DiskRoom(folder, settings.min_free_disk_mb)
    if settings.embedded_engine == "qdrant-local":
        return QdrantClientStore(dim, settings.collection, path=folder, room=room)
    index_min = settings.index_min_memories if index_min is None else index_min
    return EdgeStore(folder, dim, room, index_min, settings.hnsw_ef)


def private_copy(folder: Path, min_free_mb: int) -> Path:
    """A new temporary folder (under TMPDIR) holding a copy of the embedded store at ``folder``, made while the
    engines' own locks are held shared (qdrant-edge locks each table's ``wal`` folder, qdrant-client its
    ``.lock`` file), so that no server writes the store mid-copy; a store a server holds is refused as locked."""
    scratch = Path(tempfile.mkdtemp(prefix="memrl-read-only-"))
    try:
        with _held_shared(folder):
            need, free = allocated_bytes(folder) + min_free_mb * MB, free_bytes(scratch)
            if free < need:
                raise DiskFullError(
                    f"a read-only open works on a copy of the memory store, and {scratch.parent} has "
                    f"{free / MB:.1f} MB free where the copy needs {need / MB:.1f} MB (the store's "
                    f"{(need - min_free_mb * MB) / MB:.1f} MB and min_free_disk_mb={min_free_mb}): point TMPDIR "
                    "to a folder with room"
                )
            if folder.is_dir():
                copy_sparse(folder, scratch / folder.name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


@contextmanager
def _held_shared(folder: Path) -> Iterator[None]:
    locks = [path for path in folder.rglob("*") if path.name in ("wal", ".lock")] if folder.is_dir() else []
    with flocked(locks, fcntl.LOCK_SH) as busy:
        if busy is not None:
            raise StoreLockedError(folder, f"{busy} is locked by the process serving it")
        yield
