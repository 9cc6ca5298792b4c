"""The embedding cache, partitioned by namespace, and the canonical form of a task text."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from memrl_mcp.embeddings.base import Embedder


class CachedEmbedder:
    """An embedder with a least-recently-used cache of ``size`` texts.

    Agents come back to the same tasks (a retry, the next epoch of a benchmark, a recurring chore); a
    repeated task then costs a dictionary lookup instead of a model run or a paid API call. Thread-safe; vectors are
    returned as copies.

    Entries are keyed by ``scope`` too (the memory passes the namespace, its unit of tenancy): a hit skips a
    model run, so a cache shared across tenants would let one tenant learn by timing which task texts another sent
    recently (docs/security.md, "Tenancy fails closed"). Within a scope a text is embedded once;
    across scopes never shared. ``hits`` and ``misses`` count texts, per scope (a metric, and what the tests
    assert instead of timing)."""

    def __init__(self, embedder: Embedder, size: int) -> None:
        self.inner = embedder
        self.name, self.dim, self.similarity = embedder.name, embedder.dim, embedder.similarity
        self._size = size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits: dict[str, int] = {}
        self.misses: dict[str, int] = {}

    def holds(self, text: str, scope: str = "") -> bool:
        """Whether ``text`` of ``scope`` is cached (no count: asking is not embedding)."""
        with self._lock:
            return (scope, text) in self._vectors

    def embed(self, texts: Sequence[str], scope: str = "") -> np.ndarray:
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for row, text in enumerate(texts):
                cached = self._vectors.get((scope, text))
                if cached is None:
                    missing.setdefault(text, []).append(row)
                else:
                    self._vectors.move_to_end((scope, text))
                    vectors[row] = cached
            missed = sum(len(rows) for rows in missing.values())
            self.hits[scope] = self.hits.get(scope, 0) + len(texts) - missed
            self.misses[scope] = self.misses.get(scope, 0) + missed
        if missing:
            fresh = self.inner.embed(list(missing))
            with self._lock:
                for (text, rows), vector in zip(missing.items(), fresh, strict=True):
                    vectors[rows] = vector
                    self._vectors[(scope, text)] = vector
                while len(self._vectors) > self._size:
                    self._vectors.popitem(last=False)
        return vectors


def cached(embedder: Embedder, task: str, scope: str) -> bool:
    """Whether embedding ``task`` in ``scope`` (:func:`embed_tasks`) runs no model: a cache holds its vector."""
    return isinstance(embedder, CachedEmbedder) and embedder.holds(canonical_task(task), scope)


def canonical_task(task: str) -> str:
    """One form per task: spacing and a trailing full stop make no twin (MiniLM puts "x." and "x" as far as 0.90
    apart, while distinct tasks reach 0.98)."""
    return " ".join(task.split()).rstrip(".!;, ") or task.strip()


def embed_scoped(embedder: Embedder, texts: Sequence[str], scope: str) -> np.ndarray:
    """Embed through the cache's partition ``scope`` (the namespace, the unit of tenancy: a caller can only hit
    vectors computed for a namespace its token may use, so the time of a call tells nothing about another
    tenant's recent texts)."""
    if isinstance(embedder, CachedEmbedder):
        return embedder.embed(texts, scope=scope)
    return embedder.embed(texts)


def embed_tasks(embedder: Embedder, tasks: Sequence[str], scope: str) -> np.ndarray:
    """Embed the tasks' canonical forms (:func:`canonical_task`), in ``scope``."""
    return embed_scoped(embedder, [canonical_task(task) for task in tasks], scope)
