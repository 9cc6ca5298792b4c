"""The store port: five tables of points with a vector and a JSON payload, and the few primitives the memory needs.

- ``memories`` and ``recalls``: the episode memory (MemRL), cosine over task embeddings;
- ``steps``: the step memory (Rememberer), one record per (namespace, task, observation), whose vector is the
  task's and the observation's unit embeddings side by side, searched by dot product: a query
  ``[(1 - w) g, w o]`` then scores ``(1 - w) cos(g, g') + w cos(o, o')``, the weighted match of both parts in one
  search, with the weight chosen per query (nothing stored depends on it);
- ``episodes``: the once-only ledger of reported trajectories, keyed by episode id (a 1-d placeholder vector);
- ``history``: the older events of each memory's Q history, 8 events per point (a chunk), the last
  ``ceil(q_history_size / 8)`` chunks kept per memory (a 1-d placeholder vector; :mod:`memrl_mcp.memory.history`
  says why they leave the memory).

Two engines implement :class:`Store`: :class:`~memrl_mcp.storage.edge.EdgeStore` (qdrant-edge, Qdrant's Rust engine
in process: the embedded default) and :class:`~memrl_mcp.storage.qdrant.QdrantClientStore` (qdrant-client, against a
Qdrant server or its own local mode).

Both keep the utility ``q`` and the bookkeeping in the payload; the fields that searches, counts and purges filter
on are indexed (:data:`INDEXES`), each table only its own: every index costs RAM, and on tmpfs several MB of disk.
A recall is stored as a point whose vector is the query embedding, so reporting it can store the new experience
without embedding the task again. Every open creates the payload indexes a table lacks: a process killed during the
first open of a fresh store (between creating a table and indexing it) would otherwise leave it unindexed for good.

:meth:`Store.set_payload_if` is the one primitive for writers that share a store (threads, or replicas on one
Qdrant server): a write applied only while the point still matches a condition, which says whether it was. Qdrant
applies the update operations of a shard one after another, so the condition and the write cannot be split by
another writer, but it does not say whether a write applied: the adapter of a Qdrant server reads the fields back.
An embedded engine is its process's alone and orders its writes with a lock: under it, the point read is the one
the write meets, so it checks the condition itself (:func:`matches`) and knows.

Layers over a store (:class:`~memrl_mcp.storage.layers.StoreLayer`): :class:`~memrl_mcp.storage.quota.MeteredStore`
counts each namespace's bytes for its storage quota and has tables whose deleted points hold too much disk compacted;
:class:`~memrl_mcp.storage.layers.ReadOnlyStore` refuses every write, and gives an embedded engine a private copy of
the store to open.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from memrl_mcp.errors import MemrlError
from memrl_mcp.storage.numbers import kept
from memrl_mcp.storage.tally import Counts

Table = Literal["memories", "recalls", "steps", "episodes", "history"]


@dataclass(frozen=True)
class Range:
    """A numeric field within bounds (each optional, inclusive ``gte``/``lte`` or strict ``gt``/``lt``)."""

    gte: float | None = None
    gt: float | None = None
    lte: float | None = None
    lt: float | None = None

    def __and__(self, other: Range) -> Range:
        """Values within both ranges."""
        return Range(
            gte=_tighter(max, self.gte, other.gte),
            gt=_tighter(max, self.gt, other.gt),
            lte=_tighter(min, self.lte, other.lte),
            lt=_tighter(min, self.lt, other.lt),
        )


def _tighter(pick: Callable[[float, float], float], a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else pick(a, b)


@dataclass(frozen=True)
class Words:
    """Full-text match: every word of ``text`` is a word of the field, in any order, case-insensitive (Qdrant's
    default word tokenizer, with a text index or without one, in every engine)."""

    text: str


Condition = str | int | Sequence[str] | Range | Words | None


Where = Mapping[Any, Condition]
"""Conditions on payload fields, all of which must hold: an exact value, a list of accepted values, a
:class:`Range`, :class:`Words`, or None: the field is absent (what a schema migration looks for). A tuple of fields
as the key: the condition holds on any one of them. (Keys typed ``Any``: a mapping's key type is invariant, so
``str | tuple[str, ...]`` would refuse a plain ``{"namespace": name}``.)"""


TABLES: tuple[Table, ...] = ("memories", "recalls", "steps", "episodes", "history")


EXPIRY = "expires_at"  # float: when a recall may be purged


IndexKind = Literal["keyword", "float", "integer", "text"]


INDEXES: dict[Table, dict[str, IndexKind]] = {
    # q, visits and updated_at: the sort keys of list_memories (order_by needs a range index); task and
    # experience: its full-text filter.
    "memories": {
        "namespace": "keyword",
        "outcome": "keyword",
        "q": "float",
        "visits": "integer",
        "updated_at": "float",
        "task": "text",
        "experience": "text",
    },
    "recalls": {"namespace": "keyword", "status": "keyword", EXPIRY: "float"},
    # nearest: the record capacity's ordered look-up of the closest pair; nearest_weight: counting the records whose
    # nearest is out of date (without the index a count reads every record's payload).
    "steps": {"namespace": "keyword", "nearest": "float", "nearest_weight": "float"},
    "episodes": {"namespace": "keyword", "status": "keyword"},
    # memory: the chunks of a deleted memory (by its id), whatever q_history_size they were written with.
    "history": {"namespace": "keyword", "memory": "keyword"},
}


PLACEHOLDER = np.ones(1, dtype=np.float32)  # the vector of an episode record or a history chunk: looked up by id


def vector_size(table: Table, dim: int) -> int:
    """The vector size of a table for an embedder of ``dim`` dimensions."""
    return {"steps": 2 * dim, "episodes": 1, "history": 1}.get(table, dim)


def is_dot(table: Table) -> bool:
    """Steps, episodes and history chunks are scored by dot product (module docstring); memories and recalls by
    cosine."""
    return table in ("steps", "episodes", "history")


LARGE_FIELDS = ("history", "applied")
"""Payload fields a search never needs (the Q history, the optimistic bookkeeping: up to 64 operation ids, converted
per hit): left out of its results."""


SCROLL_PAGE = 1000


class StoreLockedError(MemrlError):
    """The embedded store's folder is held by another process."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(
            f"the memory store at {path} is already open in another process ({detail}). An embedded store "
            "serves one process: share one memory by running a single `memrl-mcp --transport streamable-http` "
            "server and pointing every client at it, or use a Qdrant server (MEMRL_QDRANT_URL), "
            "or give this process its own MEMRL_DATA_DIR."
        )


class StoreNotWritableError(MemrlError):
    """A writable server was given a store it cannot write (a read-only volume)."""


class StoreMissingError(MemrlError):
    """A read-only server found no store to read."""


@dataclass(frozen=True)
class Point:
    """A point to write: id, vector, payload (its floats made ones the engines keep: :mod:`.numbers`)."""

    id: str
    vector: np.ndarray
    payload: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "payload", kept(self.payload))


@dataclass(frozen=True)
class Hit:
    """A search result: point id, similarity (cosine; for steps the weighted dot product), payload, and the
    vector when it was asked for."""

    id: str
    similarity: float
    payload: dict[str, Any]
    vector: np.ndarray | None = None


def as_set(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a ``set_payload`` of ``payload`` leaves, as the engine keeps them: floats kept
    (:func:`~memrl_mcp.storage.numbers.kept`), and a field set to null removed (what both engines do: qdrant-edge
    0.9, qdrant-client's local mode), while an upsert keeps a null."""
    return {key: value for key, value in kept(payload).items() if value is not None}


def matches(payload: Mapping[str, Any], where: Where) -> bool:
    """Whether a payload meets ``where`` as the engines read it: an exact value (of the same type), one of a list of
    values, or None (the field absent, null or an empty list). A tuple key: any of its fields."""
    for key, condition in where.items():
        fields = key if isinstance(key, tuple) else (key,)
        if not any(_holds(payload.get(field), condition) for field in fields):
            return False
    return True


def fields_of(where: Where) -> list[str]:
    """The payload fields ``where`` reads."""
    return [field for key in where for field in (key if isinstance(key, tuple) else (key,))]


def _holds(value: Any, condition: Condition) -> bool:
    if condition is None:
        return value is None or value == []
    if isinstance(condition, Range | Words):
        raise TypeError(f"a conditional write takes exact values, not {type(condition).__name__}")
    if isinstance(condition, str | int):
        return type(value) is type(condition) and value == condition
    return any(type(value) is type(accepted) and value == accepted for accepted in condition)


def optional_vector(vector: Any) -> np.ndarray | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32)


class Store(Protocol):
    """What the memory service needs from a vector store."""

    def upsert(self, table: Table, points: Sequence[Point]) -> None: ...

    def insert(self, table: Table, point: Point) -> None:
        """Write ``point`` only if no point has its id (atomically): of racing creators, the first wins and the
        others change nothing; read it back to learn which."""
        ...

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """The points of ``ids`` that exist, with only ``fields`` of their payload (None: all of it)."""
        ...

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None: ...

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None: ...

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> bool:
        """Set ``payload`` only if the point still matches ``where``, atomically; whether it did. An engine that
        cannot know it reads the fields back: False may then also mean that another writer replaced them at once."""
        ...

    def delete(self, table: Table, ids: Sequence[str]) -> None: ...

    def delete_namespace(self, table: Table, namespace: str) -> None: ...

    def purge_recalls(self, expired_before: float) -> None: ...

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
    ) -> list[Hit]:
        """The nearest points of ``table``, their payloads without :data:`LARGE_FIELDS`."""
        ...

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        """Up to ``limit`` points in id order from ``offset`` (included), payloads without :data:`LARGE_FIELDS`;
        and the id the next page starts at (None: no more)."""
        ...

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """The first ``limit`` points by the value of ``key`` (an indexed number), payloads without
        :data:`LARGE_FIELDS`; the order of equal values is the engine's, unspecified."""
        ...

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every point matching ``where``, with only ``fields`` of its payload (None: all of it)."""
        ...

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        """Every point matching ``where`` with its vector and only ``fields`` of its payload."""
        ...

    def count(self, table: Table, where: Where | None = None) -> int: ...

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        """The memories' counts for ``memory_stats``, of ``namespaces`` (None: all)."""
        ...

    def usage(self, namespace: str) -> int | None:
        """Bytes the namespace's records take (:mod:`memrl_mcp.storage.quota`); None where they are not measured."""
        ...

    def compact(self, table: Table) -> None:
        """Give back the disk space of the table's deleted points (in the background), where the engine can."""
        ...

    def flush(self, table: Table) -> None:
        """Make the table's writes durable, and let the engine reuse the room of the versions they replaced:
        qdrant-edge frees a replaced payload, and truncates its write-ahead log, only at a flush."""
        ...

    def reclaim(self, namespace: str) -> int:
        """Give back, where it may now, the room of the versions the namespace's writes replaced, which its usage
        counts (:class:`~memrl_mcp.storage.quota.MeteredStore`); the bytes of such versions still held."""
        ...

    def close(self) -> None: ...


def new_id() -> str:
    """Point ids are UUIDs: both engines accept them, and they cannot be guessed."""
    return str(uuid.uuid4())
