"""Storage: the store port (:mod:`~memrl_mcp.storage.store`) and its two engines, the disk guard, the counts of
``memory_stats``, the schema's migrations, and the floats the engines keep exactly."""

from __future__ import annotations

from memrl_mcp.settings import StorageSettings
from memrl_mcp.storage.disk import DiskFullError, DiskRoom
from memrl_mcp.storage.edge import EdgeStore
from memrl_mcp.storage.qdrant import QdrantClientStore
from memrl_mcp.storage.store import (
    PLACEHOLDER,
    Hit,
    Point,
    Range,
    Store,
    StoreLockedError,
    Table,
    Where,
    Words,
    new_id,
)

__all__ = [
    "PLACEHOLDER",
    "DiskFullError",
    "EdgeStore",
    "Hit",
    "Point",
    "QdrantClientStore",
    "Range",
    "Store",
    "StoreLockedError",
    "Table",
    "Where",
    "Words",
    "new_id",
    "open_store",
]


def open_store(settings: StorageSettings, dim: int) -> Store:
    """The store the settings ask for: a Qdrant server if a URL is set, else an embedded engine."""
    if settings.qdrant_url:
        api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return QdrantClientStore(dim, settings.collection, url=settings.qdrant_url, api_key=api_key)
    folder = settings.data_dir / settings.collection
    if settings.embedded_engine == "qdrant-local":
        path = folder / "qdrant-local"
        return QdrantClientStore(dim, settings.collection, path=path, room=DiskRoom(path, settings.min_free_disk_mb))
    room = DiskRoom(folder / "edge", settings.min_free_disk_mb)
    return EdgeStore(folder / "edge", dim, room, settings.index_min_memories, settings.hnsw_ef)
