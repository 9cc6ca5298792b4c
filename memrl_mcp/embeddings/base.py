"""The embedder port: task text -> unit vector, so that cosine similarity is a plain dot product; and the similarity
constants that go with each model.

The similarity scale depends on the model (two tasks of one benchmark average 0.26 with MiniLM; the official MemRL
code uses 0.19 for text-embedding-3-large), so every embedder carries the constants that go with it
(:class:`SimilarityProfile`); settings override them, and ``memrl-mcp calibrate`` measures them for any embedder on
the user's own tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from memrl_mcp.errors import MemrlError


class ModelIntegrityError(MemrlError):
    """A model file is missing or is not the file whose SHA-256 the package pins."""


class EmbedderUnavailableError(MemrlError):
    """The configured embedder cannot run here: an optional package is not installed."""


class UncalibratedModelError(MemrlError):
    """An embedder has no similarity constants: they must be measured (``memrl-mcp calibrate``) and set."""


@dataclass(frozen=True)
class SimilarityProfile:
    """Similarity constants of one embedder (docs/algorithm.md: Phase A and B, and the merge rule).

    - ``mean``, ``std``: corpus statistics of query-vs-memory cosine similarity. Phase B
      scores ``z(sim) = (sim - mean) / std`` with these fixed constants, as the official
      code does, so that a small similarity gap stays small whatever the pool.
    - ``delta``: default Phase-A threshold; a memory below it is not recalled at all.
    - ``merge``: similarity at or above which two task texts count as the same task
      (near-duplicates), so that a repeated task does not grow the memory without bound.
    """

    mean: float
    std: float
    delta: float
    merge: float


class Embedder(Protocol):
    """What the memory needs from an embedding model."""

    name: str
    dim: int

    @property
    def similarity(self) -> SimilarityProfile:
        """The embedder's similarity constants (an attribute, or computed when asked)."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Float32 array of shape ``(len(texts), dim)``, rows L2-normalised (cosine = dot)."""
        ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: np.ndarray = (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
    return unit
