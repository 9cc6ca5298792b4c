"""The learning rules, pure and small: MemRL's two-phase retrieval scores and Monte-Carlo Q update for the
episode memory, and Rememberer's n-step Q-learning for the step memory (second half of this module).

Notation follows the paper (docs/algorithm.md tells it in words):

- Phase A recalls a candidate pool C of memories whose cosine similarity to the query task is
  at least delta (top-k1). That step needs the vector index, so the store does it.
- Phase B scores each candidate ``score_i = (1 - lambda) * z_sim(sim_i) + lambda * z_Q(Q_i)`` and
  keeps the top-k2. With probability epsilon it explores instead: k2 candidates uniformly. With
  ``fade_after_days`` (not in the paper, off by default), a memory unused for longer is ranked lower
  (:func:`fade`).
- After the episode, every memory that was given to the agent moves toward the reward:
  ``Q <- Q + alpha * (R - Q)`` (gamma = 0, one terminal reward per episode).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Z_CLIP = 3.0
ZERO_SPREAD = 1e-9


@dataclass(frozen=True)
class Candidate:
    """One memory of the Phase-A pool, as Phase B sees it: its similarity, its utility, and the days since it was
    last used (stored, recalled, rewarded or edited)."""

    similarity: float
    q: float
    idle_days: float = 0.0


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
    clipped: np.ndarray = np.clip((values - values.mean()) / std, -Z_CLIP, Z_CLIP)
    return clipped


def z_similarity(similarities: np.ndarray, scale: SimilarityScale) -> np.ndarray:
    """z_sim as configured: against corpus statistics, or over the pool."""
    if scale.mode == "pool":
        return z_scores(similarities)
    return (similarities - scale.mean) / scale.std


def fade(idle_days: float, fade_after_days: float | None) -> float:
    """What a memory unused for ``idle_days`` loses of its Phase-B score: nothing within ``fade_after_days`` (None:
    never), then one unit per ``fade_after_days`` more, up to :data:`Z_CLIP`. A score is a weighted sum of z-scores,
    so a memory unused for twice the setting loses one standard deviation, for four times or more three (the most two
    z-scores differ by): it still answers when nothing else does (Phase A is unchanged), and a fresher memory of the
    same similarity and utility comes first. Learned utility cannot tell that the code moved on since; time can."""
    if fade_after_days is None or idle_days <= fade_after_days:
        return 0.0
    return min((idle_days - fade_after_days) / fade_after_days, Z_CLIP)


@dataclass(frozen=True)
class Scores:
    """Phase B's numbers for every candidate of the pool, in the pool's order."""

    z_similarity: np.ndarray
    z_q: np.ndarray
    total: np.ndarray  # (1 - lambda) z_similarity + lambda z_q - fade
    fade: np.ndarray


def phase_b_scores(
    pool: Sequence[Candidate], q_weight: float, scale: SimilarityScale, fade_after_days: float | None = None
) -> Scores:
    """score_i = (1 - lambda) z_sim(sim_i) + lambda z_Q(Q_i) - fade(idle_i) for every candidate of the pool."""
    similarities = np.array([c.similarity for c in pool], dtype=np.float64)
    utilities = np.array([c.q for c in pool], dtype=np.float64)
    faded = np.array([fade(c.idle_days, fade_after_days) for c in pool], dtype=np.float64)
    z_sim = z_similarity(similarities, scale) if pool else np.zeros(0)
    z_q = z_scores(utilities) if pool else np.zeros(0)
    return Scores(z_sim, z_q, (1.0 - q_weight) * z_sim + q_weight * z_q - faded, faded)


@dataclass(frozen=True)
class Selection:
    """Phase B's choice: the chosen candidates' indices (best first), every candidate's scores, and whether the
    choice was exploration."""

    chosen: list[int]
    scores: Scores
    explored: bool


def select(
    pool: Sequence[Candidate],
    k2: int,
    q_weight: float,
    scale: SimilarityScale,
    epsilon: float = 0.0,
    rng: random.Random | None = None,
    fade_after_days: float | None = None,
) -> Selection:
    """Phase B: the top k2 of the pool by score (:func:`phase_b_scores`).

    Ties keep the Phase-A order (higher similarity first). With probability epsilon, k2 candidates
    are drawn uniformly instead (then ordered by score, so the prompt still leads with the best).
    """
    scores = phase_b_scores(pool, q_weight, scale, fade_after_days)
    order = sorted(range(len(pool)), key=lambda i: (-scores.total[i], -pool[i].similarity, i))
    draw = rng or random.Random()
    if epsilon > 0.0 and len(pool) > k2 and draw.random() < epsilon:
        explored = set(draw.sample(range(len(pool)), k2))
        return Selection([i for i in order if i in explored], scores, True)
    return Selection(order[:k2], scores, False)


def update_q(q: float, reward: float, alpha: float) -> float:
    """Monte-Carlo utility update: Q <- Q + alpha (R - Q)."""
    return q + alpha * (reward - q)


# -- Rememberer (RLEM): step-level experience memory ------------------------------------------------
#
# Notation of "Large Language Models Are Semi-Parametric Reinforcement Learning Agents" (arXiv 2306.07929)
# and its code (OpenDFM/Rememberer): a record is keyed by (task g, observation o) and holds, per action a
# tried there, Q(g, o, a), the visits folded into it and the mean immediate reward. After an episode
# (o_0, a_0, r_0, ..., o_{T-1}, a_{T-1}, r_{T-1}), every step moves toward its n-step bootstrapped target
#     G_t = sum_{i<n} gamma^i r_{t+i} + gamma^n max_a Q(g, o_{t+n}, a)
# with the sum cut at the episode's end and the tail zero past it (or when no record matches o_{t+n}).
#
# Which Q the tail reads is a choice the definition leaves open. Rememberer's code updates each step online, as the
# episode goes: the tail is the memory as it stood before this episode's later steps (``forward``). A winning early
# step's first target then bootstraps from an observation whose record this very episode has not made yet: its tail
# is zero, and with rewards only at the end the step is marked discouraged (Q 0 <= the advice threshold) by the
# success it led to. ``backward`` credits the steps last to first, each tail read from the record as this episode's
# later steps leave it (an episodic backward update): the same target, and the final reward reaches every step in
# one report.

UpdateRule = Literal["mean", "const"]
StepOrder = Literal["backward", "forward"]


@dataclass(frozen=True)
class ActionValue:
    """One action of a record: its Q, the targets folded into it, and its mean immediate reward (the paper's
    action-capacity rule drops the action with the lowest one)."""

    action: str
    q: float
    visits: int
    reward: float


def step_similarity(task_similarity: float, observation_similarity: float, observation_weight: float) -> float:
    """How well a record matches (g, o): (1 - w) sim(g, g') + w sim(o, o'). The paper's ablation: dropping the
    observation term hurts more than dropping the task term, so w leans to the observation."""
    return (1.0 - observation_weight) * task_similarity + observation_weight * observation_similarity


def n_step_target(
    rewards: Sequence[float], t: int, n: int, gamma: float, state_values: Sequence[float | None]
) -> float:
    """G_t for step t of an episode: ``rewards[i]`` is r_i, ``state_values[j]`` is max_a Q(g, o_j, a) from the
    record matching o_j (None: no record matches, the tail is zero)."""
    end = len(rewards)
    target = sum(gamma**i * rewards[t + i] for i in range(min(n, end - t)))
    if t + n < end:
        tail = state_values[t + n]
        if tail is not None:
            target += gamma**n * tail
    return target


@dataclass(frozen=True)
class TakenStep:
    """A step of an episode as its target sees it: the record it lands on (a key per distinct observation, so a step
    that comes back to an observation lands on the record of its first visit), its action and its reward."""

    record: str
    action: str
    reward: float


@dataclass(frozen=True)
class StepRules:
    """The constants of the step memory's learning rule."""

    n: int
    gamma: float
    rule: UpdateRule
    learning_rate: float
    max_actions: int
    order: StepOrder


def episode_targets(
    steps: Sequence[TakenStep],
    rules: StepRules,
    stored: Mapping[str, Sequence[ActionValue]],
    borrowed: Sequence[float | None],
) -> list[float]:
    """G_t for every step of an episode (:func:`n_step_target`), its tails read in the ``order`` of the rules (module
    notes above). ``stored``: the actions of each record the steps land on, as stored before the episode (a record
    absent: none yet); ``borrowed[j]``: max_a Q of the nearest other record matching o_j when o_j has no record yet
    (None: none matches, or o_j has one). ``backward`` folds each step into its record (:func:`update_action_value`,
    then :func:`prune_actions`), as the report will, before the earlier steps read their tails from it; a tail is
    then the best of that record and of what ``borrowed`` lends."""
    records = {key: list(actions) for key, actions in stored.items()}
    rewards = [step.reward for step in steps]
    tails: list[float | None] = [None] * len(steps)
    targets = [0.0] * len(steps)
    for t in reversed(range(len(steps))):
        j = t + rules.n
        if j < len(steps):
            known = (state_value(records.get(steps[j].record, [])), borrowed[j])
            tails[j] = max((value for value in known if value is not None), default=None)
        targets[t] = n_step_target(rewards, t, rules.n, rules.gamma, tails)
        if rules.order == "backward":
            step, actions = steps[t], records.get(steps[t].record, [])
            old = next((a for a in actions if a.action == step.action), None)
            new = update_action_value(old, step.action, targets[t], step.reward, rules.rule, rules.learning_rate)
            folded = [new if a is old else a for a in actions] + ([] if old else [new])
            records[step.record] = prune_actions(folded, rules.max_actions)
    return targets


def state_value(actions: Sequence[ActionValue]) -> float | None:
    """max_a Q(g, o, a) of a record; None for a record without actions (no tail to bootstrap from)."""
    return max((a.q for a in actions), default=None)


def update_action_value(
    value: ActionValue | None, action: str, target: float, reward: float, rule: UpdateRule, learning_rate: float
) -> ActionValue:
    """Fold one target into an action: a running mean (``mean``: Q <- Q + (G - Q) / visits, so a new action's Q
    is its first target) or a constant rate (``const``: Q <- Q + alpha (G - Q), a new action starting at 0).
    The mean immediate reward moves the same way."""
    old = value or ActionValue(action=action, q=0.0, visits=0, reward=0.0)
    visits = old.visits + 1
    rate = 1.0 / visits if rule == "mean" else learning_rate
    return ActionValue(
        action=action,
        q=old.q + rate * (target - old.q),
        visits=visits,
        reward=old.reward + rate * (reward - old.reward),
    )


def prune_actions(actions: Sequence[ActionValue], capacity: int) -> list[ActionValue]:
    """The action capacity: while over it, drop the action with the lowest mean immediate reward (the paper's
    rule; the earliest listed goes first on a tie)."""
    kept = list(actions)
    while len(kept) > capacity:
        kept.remove(min(kept, key=lambda a: a.reward))
    return kept


@dataclass(frozen=True)
class StoredRecord:
    """A stored step record as the record capacity sees it: its id, and its samples (visits over all its actions)."""

    id: str
    samples: int


def record_to_evict(new_similarity: float, closest: tuple[StoredRecord, StoredRecord], similarity: float) -> str | None:
    """The record capacity, when the memory is full and a new record comes: ``new_similarity`` is the new record's
    similarity to its nearest stored record, ``closest`` the two stored records most similar to each other, at
    ``similarity`` (Rememberer's ``_insert_key``).

    If the new record is at least as close to a stored one as the two closest stored records are to each other,
    it adds the least: it is dropped (None). Otherwise one of the two closest goes, the one with more samples (the
    other, rarer one keeps its information in the memory; on a tie the first in storage order, the smaller id); its
    id is returned. The paper's code reads the pair off its similarity matrix; the caller finds it without one
    (:mod:`memrl_mcp.memory.steps`, "Capacities")."""
    if new_similarity >= similarity:
        return None
    first, second = sorted(closest, key=lambda record: record.id)
    return first.id if first.samples >= second.samples else second.id


@dataclass(frozen=True)
class Advice:
    """An action advised for the current step, with the numbers behind it."""

    action: str
    q: float
    visits: int


def action_advice(records: Sequence[Sequence[ActionValue]], threshold: float) -> tuple[list[Advice], list[Advice]]:
    """Encouraged and discouraged actions from the matched records, best match first.

    An action seen in several records is judged by the best-matching one. Encouraged: Q above ``threshold``,
    highest first; discouraged: Q at or below it, lowest first (the paper's code advises the best action when
    its Q > 0 and the worst when its Q <= 0: with rewards of 0 or less for failure, Q <= 0 marks an action
    that never led to success)."""
    seen: dict[str, ActionValue] = {}
    for actions in records:
        for value in actions:
            seen.setdefault(value.action, value)
    advice = [Advice(v.action, v.q, v.visits) for v in seen.values()]
    encouraged = sorted((a for a in advice if a.q > threshold), key=lambda a: (-a.q, -a.visits))
    discouraged = sorted((a for a in advice if a.q <= threshold), key=lambda a: (a.q, -a.visits))
    return encouraged, discouraged
