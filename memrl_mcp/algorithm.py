"""MemRL's learning rule, pure and small: two-phase retrieval scores and the Monte-Carlo Q update.

Notation follows the paper (and ../shared/design/MEMRL.md):

- Phase A recalls a candidate pool C of memories whose cosine similarity to the query task is
  at least delta (top-k1). That step needs the vector index, so the store does it.
- Phase B scores each candidate ``score_i = (1 - lambda) * z_sim(sim_i) + lambda * z_Q(Q_i)`` and
  keeps the top-k2. With probability epsilon it explores instead: k2 candidates uniformly.
- After the episode, every memory that was given to the agent moves toward the reward:
  ``Q <- Q + alpha * (R - Q)`` (gamma = 0, one terminal reward per episode).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Z_CLIP = 3.0
ZERO_SPREAD = 1e-9


@dataclass(frozen=True)
class Candidate:
    """One memory of the Phase-A pool, as Phase B sees it."""

    similarity: float
    q: float


@dataclass(frozen=True)
class SimilarityScale:
    """How z_sim is computed.

    ``corpus`` uses fixed mean/std of query-memory similarity for the embedder (the paper's code):
    small similarity gaps stay small, so enough utility can overturn them. ``pool`` z-scores over
    the pool itself, which stretches any gap to unit spread.
    """

    mode: Literal["corpus", "pool"]
    mean: float
    std: float


def z_scores(values: np.ndarray) -> np.ndarray:
    """z-score over the pool, clipped to [-3, 3]. A pool of one, or of equal values, carries no
    information: all zeros (the paper's "use std 1", without the rounding noise of the mean)."""
    std = float(values.std()) if values.size > 1 else 0.0
    if std <= ZERO_SPREAD:
        return np.zeros_like(values)
    return np.clip((values - values.mean()) / std, -Z_CLIP, Z_CLIP)


def z_similarity(similarities: np.ndarray, scale: SimilarityScale) -> np.ndarray:
    """z_sim as configured: against corpus statistics, or over the pool."""
    if scale.mode == "pool":
        return z_scores(similarities)
    return (similarities - scale.mean) / scale.std


def phase_b_scores(pool: Sequence[Candidate], q_weight: float, scale: SimilarityScale) -> np.ndarray:
    """score_i = (1 - lambda) z_sim(sim_i) + lambda z_Q(Q_i) for every candidate of the pool."""
    if not pool:
        return np.zeros(0)
    similarities = np.array([c.similarity for c in pool], dtype=np.float64)
    utilities = np.array([c.q for c in pool], dtype=np.float64)
    return (1.0 - q_weight) * z_similarity(similarities, scale) + q_weight * z_scores(utilities)


def select(
    pool: Sequence[Candidate],
    k2: int,
    q_weight: float,
    scale: SimilarityScale,
    epsilon: float = 0.0,
    rng: random.Random | None = None,
) -> tuple[list[int], np.ndarray, bool]:
    """Phase B: the chosen candidates' indices (best first), every candidate's score, and whether
    the choice was exploration.

    Ties keep the Phase-A order (higher similarity first). With probability epsilon, k2 candidates
    are drawn uniformly instead (then ordered by score, so the prompt still leads with the best).
    """
    scores = phase_b_scores(pool, q_weight, scale)
    order = sorted(range(len(pool)), key=lambda i: (-scores[i], -pool[i].similarity, i))
    draw = rng or random.Random()
    if epsilon > 0.0 and len(pool) > k2 and draw.random() < epsilon:
        explored = set(draw.sample(range(len(pool)), k2))
        return [i for i in order if i in explored], scores, True
    return order[:k2], scores, False


def update_q(q: float, reward: float, alpha: float) -> float:
    """Monte-Carlo utility update: Q <- Q + alpha (R - Q)."""
    return q + alpha * (reward - q)
