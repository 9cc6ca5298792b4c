"""Layers over a store: a delegating base, and the read-only layer that refuses every write."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from memrl_mcp.errors import MemrlError
from memrl_mcp.storage.store import Hit, Point, Store, Table, Where
from memrl_mcp.storage.tally import Counts


class StoreLayer:
    """A store over another one: every primitive is handed to ``inner`` unless a subclass overrides it."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        self._inner.upsert(table, points)

    def insert(self, table: Table, point: Point) -> None:
        self._inner.insert(table, point)

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        return self._inner.get(table, ids, fields)

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        return self._inner.get_vector(table, point_id)

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        self._inner.set_payload(table, point_id, payload)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> bool:
        return self._inner.set_payload_if(table, point_id, payload, where)

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        self._inner.delete(table, ids)

    def delete_namespace(self, table: Table, namespace: str) -> None:
        self._inner.delete_namespace(table, namespace)

    def purge_recalls(self, expired_before: float) -> None:
        self._inner.purge_recalls(expired_before)

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        return self._inner.search(vector, limit, min_similarity, where, table, with_vectors)

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        return self._inner.scroll_from(table, where, offset, limit)

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        return self._inner.ordered(table, where, key, descending, limit)

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._inner.scroll(table, where, fields)

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        return self._inner.vectors(table, where, fields)

    def count(self, table: Table, where: Where | None = None) -> int:
        return self._inner.count(table, where)

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        return self._inner.tally(namespaces)

    def usage(self, namespace: str) -> int | None:
        return self._inner.usage(namespace)

    def compact(self, table: Table) -> None:
        self._inner.compact(table)

    def flush(self, table: Table) -> None:
        self._inner.flush(table)

    def reclaim(self, namespace: str) -> int:
        return self._inner.reclaim(namespace)

    def close(self) -> None:
        self._inner.close()


class ReadOnlyError(MemrlError):
    """A write reached a read-only store."""


class ReadOnlyStore(StoreLayer):
    """``read_only``: every write is refused here, under the tools that already offer none, so that no code path
    can change the store. An embedded engine writes its own files at every open (qdrant-edge rewrites its config
    and compacts its journals; it cannot open a read-only filesystem at all), so it is given a private copy of the
    store (``scratch``), removed at close: the store itself is only ever read, and may sit on a read-only volume."""

    def __init__(self, inner: Store, scratch: Path | None = None) -> None:
        super().__init__(inner)
        self._scratch = scratch

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyError("the memory store is read-only (tool_profile: read_only): nothing is written")

    upsert = insert = set_payload = set_payload_if = delete = delete_namespace = purge_recalls = compact = _refuse

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
