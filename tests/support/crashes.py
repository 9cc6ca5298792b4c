"""Stores that die at a chosen write, and a store that counts its calls: the crash and cost tests' instruments."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from memrl_mcp.storage import Hit, Point, Store, Table, Where

WRITES = ("upsert", "insert", "set_payload", "set_payload_if")


class DiesAtWrite:
    """The real store, except that the process 'dies' at its n-th write (0-based) once armed."""

    def __init__(self, store: Store, n: int) -> None:
        self._store = store
        self._left = n

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in WRITES:
            return method

        def write(*args: Any, **kwargs: Any) -> Any:
            if self._left == 0:
                raise KeyboardInterrupt("killed mid-report")
            self._left -= 1
            return method(*args, **kwargs)

        return write


class CountingStore:
    """The real store, counting the records its calls return (per table), the reads of each record's payload, and the
    ids it writes."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.records_read: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.written: dict[str, set[str]] = defaultdict(set)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _saw(self, table: Table, points: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        self.records_read[table] += len(points)
        self.reads.update(point_id for point_id, _ in points)

    def get(self, table: Table, ids: Sequence[str], *args: Any) -> dict[str, dict[str, Any]]:
        found = self._store.get(table, ids, *args)
        self._saw(table, list(found.items()))
        return found

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        vector = self._store.get_vector(table, point_id)
        self.records_read[table] += vector is not None  # a vector alone: not a read of the record's payload
        return vector

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        hits = self._store.search(vector, limit, min_similarity, where, table, with_vectors)
        self._saw(table, [(hit.id, hit.payload) for hit in hits])
        return hits

    def ordered(self, table: Table, where: Any, key: str, descending: bool, limit: int) -> list[Any]:
        points = self._store.ordered(table, where, key, descending, limit)
        self._saw(table, points)
        return points

    def scroll(self, table: Table, where: Any = None, fields: Any = None) -> Iterator[tuple[str, dict[str, Any]]]:
        for point in self._store.scroll(table, where, fields):
            self._saw(table, [point])
            yield point

    def vectors(self, table: Table, where: Any, fields: Any) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        for point_id, vector, payload in self._store.vectors(table, where, fields):
            self._saw(table, [(point_id, payload)])
            yield point_id, vector, payload

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        self.written[table].update(p.id for p in points)
        self._store.upsert(table, points)

    def insert(self, table: Table, point: Point) -> None:
        self.written[table].add(point.id)
        self._store.insert(table, point)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Any) -> bool:
        self.written[table].add(point_id)
        return self._store.set_payload_if(table, point_id, payload, where)

    def reset(self) -> None:
        self.records_read.clear()
        self.reads.clear()
        self.written.clear()
