"""Rememberer's learning rule (algorithm.py, second half), computed by hand: n-step targets, the two update
rules, the capacities, the advice, and a small deterministic environment whose Q values converge as computed."""

from __future__ import annotations

import pytest

from memrl_mcp.memory.algorithm import (
    ActionValue,
    StoredRecord,
    UpdateRule,
    action_advice,
    n_step_target,
    n_step_targets,
    prune_actions,
    record_to_evict,
    state_value,
    step_similarity,
    update_action_value,
)


def test_one_step_targets_bootstrap_from_the_next_observation() -> None:
    # G_t = r_t + gamma max_a Q(o_{t+1}, a); the last step has no next observation: G = r.
    rewards, values = [0.0, 0.0, 1.0], [None, 0.5, 0.8]
    assert n_step_targets(rewards, 1, 0.9, values) == pytest.approx([0.9 * 0.5, 0.9 * 0.8, 1.0])


def test_n_step_targets_sum_n_rewards_then_bootstrap() -> None:
    rewards, values = [1.0, 2.0, 3.0, 4.0], [None, 10.0, 20.0, 30.0]
    # G_0 = 1 + 0.5 * 2 + 0.25 * 20 = 7; G_1 = 2 + 0.5 * 3 + 0.25 * 30 = 11;
    # G_2 = 3 + 0.5 * 4 (t + n is past the end: no tail); G_3 = 4 (terminal).
    assert n_step_targets(rewards, 2, 0.5, values) == pytest.approx([7.0, 11.0, 5.0, 4.0])
    # n longer than the episode: the discounted return, never a tail.
    assert n_step_targets(rewards, 10, 0.5, values) == pytest.approx([1 + 1 + 0.75 + 0.5, 2 + 1.5 + 1, 3 + 2, 4])


def test_a_next_observation_without_a_matching_record_has_no_tail() -> None:
    assert n_step_target([1.0, 2.0, 3.0, 4.0], 0, 2, 0.5, [None, 10.0, None, 30.0]) == pytest.approx(2.0)
    assert n_step_target([0.0, 0.0], 0, 1, 1.0, [None, None]) == 0.0


def test_state_value_is_the_best_action_of_a_record() -> None:
    actions = [ActionValue("a", -0.5, 1, 0.0), ActionValue("b", 0.25, 2, 0.0)]
    assert state_value(actions) == 0.25 and state_value([]) is None


def fold(targets: list[float], rule: UpdateRule, rate: float = 0.1) -> ActionValue:
    value = None
    for target in targets:
        value = update_action_value(value, "a", target, target / 2, rule, rate)
    assert value is not None
    return value


def test_mean_mode_keeps_the_running_mean_of_the_targets() -> None:
    value = fold([1.0, 0.0, 0.5], "mean")
    assert (value.q, value.visits, value.reward) == (pytest.approx(0.5), 3, pytest.approx(0.25))
    assert fold([0.7], "mean").q == pytest.approx(0.7)  # a new action's Q is its first target


def test_const_mode_moves_by_the_learning_rate() -> None:
    # 0 -> 0.1 (1 - 0) = 0.1 -> 0.1 + 0.1 (0 - 0.1) = 0.09 -> 0.09 + 0.1 (0.5 - 0.09) = 0.131
    value = fold([1.0, 0.0, 0.5], "const")
    assert (value.q, value.visits) == (pytest.approx(0.131), 3)


def test_the_action_with_the_lowest_mean_reward_goes_first() -> None:
    actions = [ActionValue("a", 0.9, 1, 0.5), ActionValue("b", 0.9, 1, -1.0), ActionValue("c", -0.9, 1, 0.2)]
    assert [a.action for a in prune_actions(actions, 2)] == ["a", "c"]
    assert [a.action for a in prune_actions(actions, 1)] == ["a"]
    assert prune_actions(actions, 3) == actions


def test_a_full_memory_drops_the_most_redundant_record() -> None:
    # Stored records a, b, c with similarities a-b 0.9, a-c 0.2, b-c 0.3: the closest pair is (a, b) at 0.9.
    a, b = StoredRecord("a", samples=3), StoredRecord("b", samples=5)
    # The new record is at most 0.5 from any stored one: it stays, and of the pair the one with more samples goes.
    assert record_to_evict(0.5, (a, b), 0.9) == "b"
    assert record_to_evict(0.5, (b, a), 0.9) == "b"  # whichever way round the pair is given
    assert record_to_evict(0.5, (StoredRecord("a", 5), StoredRecord("b", 3)), 0.9) == "a"
    # Equal samples: the first in storage order (the smaller id).
    assert record_to_evict(0.5, (StoredRecord("b", 4), StoredRecord("a", 4)), 0.9) == "a"
    # The new record is at least as close to a stored one (0.9, 0.95) as the pair: the new one is dropped.
    assert record_to_evict(0.9, (a, b), 0.9) is None
    assert record_to_evict(0.95, (a, b), 0.9) is None


def test_similarity_weights_task_and_observation() -> None:
    assert step_similarity(0.2, 0.8, 0.6) == pytest.approx(0.4 * 0.2 + 0.6 * 0.8)
    assert step_similarity(0.2, 0.8, 0.0) == pytest.approx(0.2)


def test_advice_encourages_above_the_threshold_and_discourages_at_or_below() -> None:
    best = [ActionValue("a", 0.5, 2, 0.0), ActionValue("b", -0.2, 1, 0.0)]
    second = [ActionValue("a", 0.9, 9, 0.0), ActionValue("c", 0.0, 4, 0.0), ActionValue("d", 0.3, 1, 0.0)]
    encouraged, discouraged = action_advice([best, second], 0.0)
    # "a" is judged by the best-matching record (0.5), not the second one (0.9).
    assert [(a.action, a.q, a.visits) for a in encouraged] == [("a", 0.5, 2), ("d", 0.3, 1)]
    assert [(a.action, a.q) for a in discouraged] == [("b", -0.2), ("c", 0.0)]
    assert action_advice([], 0.0) == ([], [])


# -- a deterministic environment --------------------------------------------------------------------
#
#   s0 --a--> s1 --c--> end, reward +1
#              \--d--> end, reward -1
#   s0 --b--> end, reward 0
#
# Episodes cycle through the three paths [a c], [a d], [b]. Targets are computed against the memory before each
# episode (as the server does), gamma = 0.9.

PATHS = [[("s0", "a", 0.0), ("s1", "c", 1.0)], [("s0", "a", 0.0), ("s1", "d", -1.0)], [("s0", "b", 0.0)]]


def learn(cycles: int, n: int, rule: UpdateRule, rate: float = 0.1) -> dict[tuple[str, str], ActionValue]:
    memory: dict[str, dict[str, ActionValue]] = {}
    for _ in range(cycles):
        for path in PATHS:
            values = [state_value(list(memory[s].values())) if s in memory else None for s, _, _ in path]
            targets = n_step_targets([r for _, _, r in path], n, 0.9, values)
            for (state, action, reward), target in zip(path, targets, strict=True):
                actions = memory.setdefault(state, {})
                actions[action] = update_action_value(actions.get(action), action, target, reward, rule, rate)
    return {(s, a): v for s, actions in memory.items() for a, v in actions.items()}


def test_one_step_bootstrapping_learns_the_value_of_the_best_continuation() -> None:
    q = learn(cycles=30, n=1, rule="mean")
    assert q["s1", "c"].q == 1.0 and q["s1", "d"].q == -1.0 and q["s0", "b"].q == 0.0
    # Q(s0, a): its first target was 0 (s1 unknown), every later one 0.9 max(1, -1) = 0.9; 60 visits.
    assert q["s0", "a"].visits == 60
    assert q["s0", "a"].q == pytest.approx(0.9 * 59 / 60)
    # So "a" is encouraged at s0, "b" discouraged; at s1, "c" encouraged and "d" discouraged.
    encouraged, discouraged = action_advice([[q["s0", "a"], q["s0", "b"]]], 0.0)
    assert [a.action for a in encouraged] == ["a"] and [a.action for a in discouraged] == ["b"]


def test_two_steps_cover_the_episode_and_learn_the_average_return() -> None:
    # With n = 2 every target is the episode's discounted return: Q(s0, a) averages 0.9 and -0.9 -> 0.
    q = learn(cycles=30, n=2, rule="mean")
    assert q["s0", "a"].q == pytest.approx(0.0, abs=1e-12) and q["s1", "c"].q == 1.0


def test_the_constant_rate_converges_to_the_same_values() -> None:
    q = learn(cycles=300, n=1, rule="const", rate=0.1)
    assert q["s1", "c"].q == pytest.approx(1.0, abs=1e-9) and q["s1", "d"].q == pytest.approx(-1.0, abs=1e-9)
    assert q["s0", "a"].q == pytest.approx(0.9, abs=1e-9) and q["s0", "b"].q == 0.0
