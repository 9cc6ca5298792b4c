"""Storage: the store port (:mod:`~memrl_mcp.storage.store`) and its two engines (qdrant-edge in process, a Qdrant
server or qdrant-client's local mode), the layers over them (quotas, read-only), the disk guard, the counts of
``memory_stats``, the schema's migrations, and the floats the engines keep exactly."""

from __future__ import annotations

from memrl_mcp.storage.disk import DiskFullError, DiskRoom
from memrl_mcp.storage.edge import EdgeStore
from memrl_mcp.storage.layers import ReadOnlyError, ReadOnlyStore, StoreLayer
from memrl_mcp.storage.opening import open_store, private_copy
from memrl_mcp.storage.qdrant import QdrantClientStore
from memrl_mcp.storage.store import (
    PLACEHOLDER,
    Condition,
    Hit,
    Point,
    Range,
    Store,
    StoreLockedError,
    StoreMissingError,
    StoreNotWritableError,
    Table,
    Where,
    Words,
    new_id,
)

__all__ = [
    "PLACEHOLDER",
    "Condition",
    "DiskFullError",
    "DiskRoom",
    "EdgeStore",
    "Hit",
    "Point",
    "QdrantClientStore",
    "Range",
    "ReadOnlyError",
    "ReadOnlyStore",
    "Store",
    "StoreLayer",
    "StoreLockedError",
    "StoreMissingError",
    "StoreNotWritableError",
    "Table",
    "Where",
    "Words",
    "new_id",
    "open_store",
    "private_copy",
]
