"""qdrant-client: a Qdrant server (the path for users who outgrow one machine; replicas of the memory server may
share it) or qdrant-client's own local mode (a pure-Python fallback engine)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from memrl_mcp.storage.disk import RECALL_SHARE, DiskRoom
from memrl_mcp.storage.numbers import kept
from memrl_mcp.storage.private import seal
from memrl_mcp.storage.store import (
    EXPIRY,
    INDEXES,
    LARGE_FIELDS,
    SCROLL_PAGE,
    TABLES,
    Condition,
    Hit,
    Point,
    Range,
    StoreLockedError,
    StoreMissingError,
    Table,
    Where,
    Words,
    as_set,
    is_dot,
    optional_vector,
    vector_size,
)
from memrl_mcp.storage.tally import FIELDS as TALLY_FIELDS
from memrl_mcp.storage.tally import Counts, Tally


class QdrantClientStore:
    """qdrant-client: a Qdrant server (``url``) or qdrant-client's local mode (``path``)."""

    def __init__(
        self,
        dim: int,
        collection: str,
        *,
        url: str | None = None,
        api_key: str | None = None,
        path: Path | None = None,
        room: DiskRoom | None = None,
        create: bool = True,
    ) -> None:
        """``create``: create the collections and payload indexes a store lacks (not for a read-only server)."""
        from qdrant_client import QdrantClient, models

        self._models = models
        self._room = room
        self._names = {table: f"{collection}_{table}" for table in TABLES}
        self._client_is_local = url is None
        self._path = path if url is None else None
        # On a cluster a conditional write is trusted only once read back, so writes are acknowledged after every
        # replica of the shard applied them in the leader's order, and reads consult a majority of replicas: a
        # read-back then sees the write it follows (README, "Replicas on one Qdrant server").
        self._write: dict[str, Any] = {"wait": True, "ordering": models.WriteOrdering.STRONG}
        self._read: dict[str, Any] = {"consistency": models.ReadConsistencyType.MAJORITY}
        self._without_large_fields = models.PayloadSelectorExclude(exclude=list(LARGE_FIELDS))
        # A Qdrant server applies each update atomically; local mode is Python over numpy: one call at a time.
        self._atomic: AbstractContextManager[Any] = threading.Lock() if url is None else nullcontext()
        if url is not None:
            self._client = QdrantClient(url=url, api_key=api_key)
        elif path is not None:
            path.mkdir(parents=True, exist_ok=True)
            try:
                self._client = QdrantClient(path=str(path))
            except RuntimeError as error:
                if "already accessed" in str(error):
                    raise StoreLockedError(path, "qdrant-client's local storage is locked") from None
                raise
        else:
            raise ValueError("QdrantClientStore needs a url or a path")
        for table in TABLES:
            self._ensure_collection(table, dim, create)

    def _ensure_collection(self, table: Table, dim: int, create: bool) -> None:
        """Create the collection if it is missing, then the payload indexes it lacks (server mode: local mode
        scans everything and warns that indexes do nothing); without ``create``, a missing collection is refused."""
        models, name = self._models, self._names[table]
        size = vector_size(table, dim)
        if not create and not self._client.collection_exists(name):
            raise StoreMissingError(f"the Qdrant server has no collection {name}, and a read-only server creates none")
        if self._client.collection_exists(name):
            stored_dim = getattr(self._client.get_collection(name).config.params.vectors, "size", None)
            if stored_dim is not None and stored_dim != size:
                raise ValueError(
                    f"collection {name} holds {stored_dim}-d vectors; the embedder makes {dim}-d ones "
                    f"({size}-d in this table)"
                )
        else:
            distance = models.Distance.DOT if is_dot(table) else models.Distance.COSINE
            vectors = models.VectorParams(size=size, distance=distance)
            self._client.create_collection(name, vectors_config=vectors)
        if self._client_is_local or not create:
            return
        indexed = set(self._client.get_collection(name).payload_schema)
        schemas = {
            "keyword": models.PayloadSchemaType.KEYWORD,
            "float": models.PayloadSchemaType.FLOAT,
            "integer": models.PayloadSchemaType.INTEGER,
            "text": models.PayloadSchemaType.TEXT,
        }
        for key, kind in INDEXES[table].items():
            if key not in indexed:
                self._client.create_payload_index(name, key, field_schema=schemas[kind], **self._write)

    def _check_room(self, share: float = 1.0) -> None:
        if self._room is not None:
            self._room.check(share)

    def _filter(self, where: Where | None, point_id: str | None = None) -> Any:
        models = self._models
        must: list[Any] = []
        for key, value in (where or {}).items():
            if isinstance(key, tuple):
                must.append(models.Filter(should=[self._condition(field, value) for field in key]))
            else:
                must.append(self._condition(key, value))
        if point_id is not None:
            must.append(models.HasIdCondition(has_id=[point_id]))
        return models.Filter(must=must) if must else None

    def _condition(self, key: str, value: Condition) -> Any:
        models = self._models
        if value is None:
            return models.IsEmptyCondition(is_empty=models.PayloadField(key=key))
        if isinstance(value, Range):
            return models.FieldCondition(
                key=key, range=models.Range(gte=value.gte, gt=value.gt, lte=value.lte, lt=value.lt)
            )
        if isinstance(value, Words):
            return models.FieldCondition(key=key, match=models.MatchText(text=value.text))
        if isinstance(value, list | tuple | set | frozenset):
            return models.FieldCondition(key=key, match=models.MatchAny(any=list(value)))
        return models.FieldCondition(key=key, match=models.MatchValue(value=value))

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        batch = [
            self._models.PointStruct(id=p.id, vector=p.vector.astype(np.float32).tolist(), payload=p.payload)
            for p in points
        ]
        self._check_room(RECALL_SHARE if table == "recalls" else 1.0)
        with self._atomic:
            self._client.upsert(self._names[table], batch, **self._write)

    def insert(self, table: Table, point: Point) -> None:
        models = self._models
        batch = [
            models.PointStruct(id=point.id, vector=point.vector.astype(np.float32).tolist(), payload=point.payload)
        ]
        self._check_room()
        with self._atomic:
            self._client.upsert(self._names[table], batch, update_mode=models.UpdateMode.INSERT_ONLY, **self._write)

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        payload = True if fields is None else list(fields)
        with self._atomic:
            records = self._client.retrieve(self._names[table], list(ids), with_payload=payload, **self._read)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        with self._atomic:
            records = self._client.retrieve(
                self._names[table], [point_id], with_payload=False, with_vectors=True, **self._read
            )
        return np.asarray(records[0].vector, dtype=np.float32) if records else None

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        self._check_room()
        with self._atomic:
            self._client.set_payload(self._names[table], payload=kept(payload), points=[point_id], **self._write)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> bool:
        """Qdrant does not say whether the write applied: the fields are read back and compared with the ones
        written (a replica's write may replace them at once: then False, though this one applied first)."""
        selector = self._models.FilterSelector(filter=self._filter(where, point_id))
        self._check_room()
        with self._atomic:
            self._client.set_payload(self._names[table], payload=kept(payload), points=selector, **self._write)
        written = as_set(payload)
        now = self.get(table, [point_id], list(payload)).get(point_id)
        return now is not None and {key: now[key] for key in written if key in now} == written

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        if ids:
            selector = self._models.PointIdsList(points=list(ids))
            with self._atomic:
                self._client.delete(self._names[table], points_selector=selector, **self._write)

    def delete_namespace(self, table: Table, namespace: str) -> None:
        selector = self._models.FilterSelector(filter=self._filter({"namespace": namespace}))
        with self._atomic:
            self._client.delete(self._names[table], points_selector=selector, **self._write)

    def purge_recalls(self, expired_before: float) -> None:
        models = self._models
        expired = models.Filter(must=[models.FieldCondition(key=EXPIRY, range=models.Range(lt=expired_before))])
        with self._atomic:
            self._client.delete(
                self._names["recalls"], points_selector=models.FilterSelector(filter=expired), **self._write
            )

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        with self._atomic:
            response = self._client.query_points(
                self._names[table],
                query=vector.astype(np.float32).tolist(),
                query_filter=self._filter(where),
                score_threshold=min_similarity,
                limit=limit,
                with_payload=self._without_large_fields,
                with_vectors=with_vectors,
                **self._read,
            )
        return [
            Hit(str(p.id), float(p.score), dict(p.payload or {}), optional_vector(p.vector)) for p in response.points
        ]

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        for r in self._records(table, where, list(fields), with_vectors=True):
            yield str(r.id), np.asarray(r.vector, dtype=np.float32), dict(r.payload or {})

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        with self._atomic:
            records, next_offset = self._client.scroll(
                self._names[table],
                scroll_filter=self._filter(where),
                limit=limit,
                offset=offset,
                with_payload=self._without_large_fields,
                **self._read,
            )
        return [(str(r.id), dict(r.payload or {})) for r in records], None if next_offset is None else str(next_offset)

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        models = self._models
        direction = models.Direction.DESC if descending else models.Direction.ASC
        with self._atomic:
            records, _ = self._client.scroll(
                self._names[table],
                scroll_filter=self._filter(where),
                limit=limit,
                order_by=models.OrderBy(key=key, direction=direction),
                with_payload=self._without_large_fields,
                **self._read,
            )
        return [(str(r.id), dict(r.payload or {})) for r in records]

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        for r in self._records(table, where, True if fields is None else list(fields), with_vectors=False):
            yield str(r.id), dict(r.payload or {})

    def _records(
        self, table: Table, where: Where | None, payload: bool | list[str], with_vectors: bool
    ) -> Iterator[Any]:
        """Every record of ``table`` matching ``where``, a page at a time (each page read in one atomic step)."""
        offset = None
        while True:
            with self._atomic:
                records, offset = self._client.scroll(
                    self._names[table],
                    scroll_filter=self._filter(where),
                    limit=SCROLL_PAGE,
                    offset=offset,
                    with_payload=payload,
                    with_vectors=with_vectors,
                    **self._read,
                )
            yield from records
            if offset is None:
                return

    def count(self, table: Table, where: Where | None = None) -> int:
        # Qdrant's count takes no read consistency; counts feed statistics and bounds, never a correctness check.
        with self._atomic:
            return int(self._client.count(self._names[table], count_filter=self._filter(where), exact=True).count)

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        """Counted by reading the memories: replicas share the collection, so no process sees every write."""
        where = None if namespaces is None else {"namespace": list(namespaces)}
        return Tally.of(payload for _, payload in self.scroll("memories", where, TALLY_FIELDS)).total()

    def usage(self, namespace: str) -> int | None:
        return (
            None  # measured by the layer over an embedded store (memrl_mcp.storage.quota); a server's replicas cannot
        )

    def compact(self, table: Table) -> None:
        """Nothing to do: local mode keeps its points in SQLite, which reuses the pages of deleted points for later
        writes (it does not return them to the filesystem); a Qdrant server vacuums its own segments."""

    def flush(self, table: Table) -> None:
        """Nothing to do: local mode writes each point through SQLite, which reuses the pages of the version it
        replaces; a Qdrant server flushes by itself."""

    def reclaim(self, namespace: str) -> int:
        return 0  # nothing held: see flush

    def close(self) -> None:
        """Close the client; local mode's folder is then made private (:func:`seal`: what it made under an open
        umask)."""
        with self._atomic:
            self._client.close()
        if self._path is not None:
            seal(self._path)
