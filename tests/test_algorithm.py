"""The two-phase maths and the Q update, against values computed by hand."""

import random

import numpy as np
import pytest

from memrl_mcp.memory.algorithm import Candidate, SimilarityScale, fade, phase_b_scores, select, update_q, z_scores

CORPUS = SimilarityScale(mode="corpus", mean=0.3, std=0.1)
POOL = SimilarityScale(mode="pool", mean=0.0, std=1.0)

# docs/algorithm.md's case: a small similarity gap (0.85 / 0.83 / 0.78) and a clear utility winner.
SMALL_GAP = [Candidate(0.85, 0.0), Candidate(0.83, 0.0), Candidate(0.78, 1.0)]


def test_z_scores_edge_cases() -> None:
    assert z_scores(np.array([0.7])).tolist() == [0.0]
    assert z_scores(np.array([0.2, 0.2, 0.2])).tolist() == [0.0, 0.0, 0.0]
    clipped = z_scores(np.array([0.0] * 99 + [100.0]))
    assert clipped[-1] == 3.0 and clipped[0] == pytest.approx(-0.1005, abs=1e-4)


def test_scores_with_corpus_statistics_by_hand() -> None:
    # z_sim = (sim - 0.3) / 0.1 = 5.5, 5.3, 4.8; z_Q over the pool of Q = 0, 0, 1:
    # mean 1/3, std sqrt(2/9) = 0.4714 -> -0.7071, -0.7071, 1.4142.
    scores = phase_b_scores(SMALL_GAP, q_weight=0.5, scale=CORPUS).total
    assert scores.tolist() == pytest.approx([2.39645, 2.29645, 3.10711], abs=1e-4)
    selection = select(SMALL_GAP, k2=1, q_weight=0.5, scale=CORPUS)
    chosen, explored = selection.chosen, selection.explored
    assert chosen == [2] and not explored


def test_fade_takes_one_unit_per_fade_after_days_past_it_up_to_three() -> None:
    assert [fade(days, 30.0) for days in (0.0, 30.0, 45.0, 60.0, 120.0, 10_000.0)] == [0.0, 0.0, 0.5, 1.0, 3.0, 3.0]
    assert fade(10_000.0, None) == 0.0  # the default: no fading


def test_a_memory_unused_for_long_is_ranked_lower_and_only_then() -> None:
    """docs/algorithm.md's case, SMALL_GAP: the utility winner (index 2) leads by 0.71 of score. Unused for
    three times fade_after_days it loses 2 and falls behind both; within fade_after_days nothing changes; and an
    old memory that is alone in its pool is still chosen (Phase A is unchanged)."""
    stale = [Candidate(0.85, 0.0, 1.0), Candidate(0.83, 0.0, 1.0), Candidate(0.78, 1.0, 90.0)]
    scores = phase_b_scores(stale, q_weight=0.5, scale=CORPUS, fade_after_days=30.0)
    assert scores.fade.tolist() == [0.0, 0.0, 2.0]
    assert scores.total.tolist() == pytest.approx([2.39645, 2.29645, 1.10711], abs=1e-4)
    assert select(stale, k2=1, q_weight=0.5, scale=CORPUS, fade_after_days=30.0).chosen == [0]
    assert select(stale, k2=1, q_weight=0.5, scale=CORPUS, fade_after_days=90.0).chosen == [2]
    assert select(stale, k2=1, q_weight=0.5, scale=CORPUS).chosen == [2]
    assert select(stale[2:], k2=1, q_weight=0.5, scale=CORPUS, fade_after_days=1.0).chosen == [0]


def test_pool_z_similarity_lets_a_small_gap_beat_any_utility() -> None:
    # Per-pool z_sim: mean 0.82, std 0.02944 -> 1.0190, 0.3397, -1.3587; the loser cannot win.
    scores = phase_b_scores(SMALL_GAP, q_weight=0.5, scale=POOL).total
    assert scores.tolist() == pytest.approx([0.15594, -0.18371, 0.02777], abs=1e-4)
    for q_loser in (1.0, 10.0, 1e6):
        pool = [Candidate(0.85, -1.0), Candidate(0.83, -1.0), Candidate(0.78, q_loser)]
        assert 2 not in select(pool, k2=1, q_weight=0.5, scale=POOL).chosen
        assert select(pool, k2=1, q_weight=0.5, scale=CORPUS).chosen == [2]


def test_lambda_zero_is_similarity_order_and_lambda_one_is_utility_order() -> None:
    pool = [Candidate(0.9, -0.5), Candidate(0.7, 0.8), Candidate(0.8, 0.1)]
    assert select(pool, k2=3, q_weight=0.0, scale=CORPUS).chosen == [0, 2, 1]
    assert select(pool, k2=3, q_weight=1.0, scale=CORPUS).chosen == [1, 2, 0]


def test_ties_keep_similarity_order() -> None:
    pool = [Candidate(0.6, 0.0), Candidate(0.9, 0.0), Candidate(0.6, 0.0)]
    assert select(pool, k2=3, q_weight=1.0, scale=CORPUS).chosen == [1, 0, 2]


def test_epsilon_greedy_is_seeded_and_uniform() -> None:
    pool = [Candidate(0.9 - i / 100, 0.0) for i in range(10)]
    first = [select(pool, 3, 0.5, CORPUS, epsilon=1.0, rng=random.Random(7)).chosen for _ in range(2)]
    assert first[0] == first[1]
    picks = np.zeros(10)
    rng = random.Random(1)
    for _ in range(3000):
        selection = select(pool, 3, 0.5, CORPUS, epsilon=1.0, rng=rng)
        chosen, explored = selection.chosen, selection.explored
        assert explored and len(set(chosen)) == 3
        picks[chosen] += 1
    assert picks.min() > 0.8 * 900 and picks.max() < 1.2 * 900  # each index ~ 3000 * 3 / 10 times
    assert not select(pool, 3, 0.5, CORPUS, epsilon=0.0, rng=rng).explored


def test_small_pool_is_returned_whole() -> None:
    assert select([Candidate(0.5, 0.0)], k2=3, q_weight=0.5, scale=CORPUS, epsilon=1.0).chosen == [0]
    assert select([], k2=3, q_weight=0.5, scale=CORPUS).chosen == []


def test_monte_carlo_update_by_hand() -> None:
    q = update_q(0.0, 1.0, alpha=0.3)
    assert q == pytest.approx(0.3)
    assert update_q(q, -1.0, alpha=0.3) == pytest.approx(-0.09)
    assert update_q(0.5, 0.5, alpha=0.3) == pytest.approx(0.5)
