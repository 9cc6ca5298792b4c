"""Rememberer's learning rule (algorithm.py, second half), computed by hand: n-step targets, credited backward
(the default) and forward, the two update rules, the capacities, the advice, and a small deterministic environment
whose Q values converge as computed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from memrl_mcp.memory.algorithm import (
    ActionValue,
    StepOrder,
    StepRules,
    StoredRecord,
    TakenStep,
    UpdateRule,
    action_advice,
    episode_targets,
    n_step_target,
    prune_actions,
    record_to_evict,
    state_value,
    step_similarity,
    update_action_value,
)


def n_step_targets(rewards: list[float], n: int, gamma: float, values: list[float | None]) -> list[float]:
    return [n_step_target(rewards, t, n, gamma, values) for t in range(len(rewards))]


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


def rules(order: StepOrder, n: int = 1, gamma: float = 1.0, rule: UpdateRule = "mean", rate: float = 0.1) -> StepRules:
    return StepRules(n, gamma, rule, rate, max_actions=10, order=order)


def episode(*steps: tuple[str, str, float]) -> list[TakenStep]:
    """(observation, action, reward) steps, each observation its own record key."""
    return [TakenStep(o, a, r) for o, a, r in steps]


def targets(
    steps: Sequence[TakenStep],
    step_rules: StepRules,
    stored: Mapping[str, Sequence[ActionValue]] | None = None,
    borrowed: Sequence[float | None] | None = None,
) -> list[float]:
    return episode_targets(steps, step_rules, stored or {}, borrowed or [None] * len(steps))


WIN = episode(("ticket", "read the log", 0.0), ("log", "check the disk", 0.0), ("disk full", "grow the volume", 1.0))


def test_backward_credit_brings_the_final_reward_to_every_step_of_the_report() -> None:
    # Nothing known yet. Backward, n = 1, gamma = 0.9: G_2 = 1, folded first (Q(disk full, grow) = 1 under mean); then
    # G_1 = 0 + 0.9 x 1 = 0.9, folded (Q(log, check) = 0.9); G_0 = 0 + 0.9 x 0.9 = 0.81.
    assert targets(WIN, rules("backward", gamma=0.9)) == pytest.approx([0.81, 0.9, 1.0])
    assert targets(WIN, rules("backward")) == pytest.approx([1.0, 1.0, 1.0])
    # Forward (Rememberer's code): the tails are the memory before the episode, which knows nothing: the success
    # marks its two winning early steps with Q 0, at the advice threshold: discouraged.
    assert targets(WIN, rules("forward", gamma=0.9)) == pytest.approx([0.0, 0.0, 1.0])


def test_the_backward_tail_is_the_best_action_of_the_record_after_the_later_steps() -> None:
    # The evidence record already knows a good remedy (Q 0.5); this episode tries another one, which fails.
    stored = {"disk full": [ActionValue("grow the volume", 0.5, 2, 0.5)]}
    lost = episode(("ticket", "read the log", 0.0), ("log", "check the disk", 0.0), ("disk full", "reboot", -1.0))
    # G_2 = -1, folded beside 0.5; G_1 = 0 + max(0.5, -1) = 0.5 (the early steps were right: the mistake is the
    # remedy's alone); G_0 = 0 + max Q(log) after G_1's fold = 0.5.
    assert targets(lost, rules("backward"), stored) == pytest.approx([0.5, 0.5, -1.0])
    # Forward: G_1 reads the stored 0.5 too, but G_0 reads the log record, which does not exist yet: 0.
    assert targets(lost, rules("forward"), stored) == pytest.approx([0.0, 0.5, -1.0])


def test_backward_n_step_targets_bootstrap_from_the_records_this_episode_just_made() -> None:
    steps = episode(("o0", "a", 0.0), ("o1", "b", 0.0), ("o2", "c", 0.0), ("o3", "d", 1.0))
    # n = 2, gamma = 0.5. G_3 = 1 -> Q(o3) = 1; G_2 = 0 + 0.5 x 1 = 0.5 (t + n past the end) -> Q(o2) = 0.5;
    # G_1 = 0 + 0 + 0.25 max Q(o3) = 0.25; G_0 = 0 + 0 + 0.25 max Q(o2) = 0.125.
    assert targets(steps, rules("backward", n=2, gamma=0.5)) == pytest.approx([0.125, 0.25, 0.5, 1.0])
    assert targets(steps, rules("forward", n=2, gamma=0.5)) == pytest.approx([0.0, 0.0, 0.5, 1.0])


def test_backward_folds_with_the_update_rule_the_report_applies() -> None:
    # const, rate 0.5, gamma 1: G_2 = 1 -> Q(o2) = 0 + 0.5 (1 - 0) = 0.5; G_1 = 0.5 -> Q(o1) = 0.25; G_0 = 0.25.
    assert targets(WIN, rules("backward", rule="const", rate=0.5)) == pytest.approx([0.25, 0.5, 1.0])
    # A step coming back to an observation lands on its record: the loop ticket -> log -> ticket, then a win.
    loop = episode(("ticket", "read the log", 0.0), ("log", "go back", 0.0), ("ticket", "grow the volume", 1.0))
    # G_2 = 1 -> Q(ticket, grow) = 1; G_1 = 0 + max Q(ticket) = 1; G_0 = 0 + max Q(log) = 1.
    assert targets(loop, rules("backward")) == pytest.approx([1.0, 1.0, 1.0])
    # The action capacity is applied too: with one action per record, a new action with a lower mean immediate
    # reward than the stored one is dropped at once, so the tail stays the stored action's Q.
    stored = {"log": [ActionValue("tail the log", 0.9, 3, 0.5)]}
    one = StepRules(1, 1.0, "mean", 0.1, max_actions=1, order="backward")
    assert targets(WIN, one, stored) == pytest.approx([0.9, 1.0, 1.0])


def test_a_borrowed_tail_counts_beside_the_records_own_actions() -> None:
    # No record of "log" before the episode, but a near one lends 0.8. Forward: G_0 = 0.8. Backward: the best of
    # the record after G_1's fold (1.0) and the lent 0.8.
    assert targets(WIN, rules("forward"), borrowed=[None, 0.8, None]) == pytest.approx([0.8, 0.0, 1.0])
    assert targets(WIN, rules("backward"), borrowed=[None, 0.8, None]) == pytest.approx([1.0, 1.0, 1.0])
    # Lent 3 at "disk full": G_1 = max(1, 3) = 3, folded into "log" (Q 3), so G_0 = max(3, lent 2) = 3.
    assert targets(WIN, rules("backward"), borrowed=[None, 2.0, 3.0]) == pytest.approx([3.0, 3.0, 1.0])


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
    assert (value.q, value.visits, value.reward) == pytest.approx((0.5, 3, 0.25))
    assert fold([0.7], "mean").q == pytest.approx(0.7)  # a new action's Q is its first target


def test_const_mode_moves_by_the_learning_rate() -> None:
    # 0 -> 0.1 (1 - 0) = 0.1 -> 0.1 + 0.1 (0 - 0.1) = 0.09 -> 0.09 + 0.1 (0.5 - 0.09) = 0.131
    value = fold([1.0, 0.0, 0.5], "const")
    assert (value.q, value.visits) == pytest.approx((0.131, 3))


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
# episode (as the server does), gamma = 0.9, then folded in order.

PATHS = [[("s0", "a", 0.0), ("s1", "c", 1.0)], [("s0", "a", 0.0), ("s1", "d", -1.0)], [("s0", "b", 0.0)]]


def learn(
    cycles: int, n: int, rule: UpdateRule, rate: float = 0.1, order: StepOrder = "backward", paths: list = PATHS
) -> dict[tuple[str, str], ActionValue]:
    memory: dict[str, dict[str, ActionValue]] = {}
    step_rules = StepRules(n, 0.9, rule, rate, max_actions=10, order=order)
    for _ in range(cycles):
        for path in paths:
            stored = {s: list(actions.values()) for s, actions in memory.items()}
            for (state, action, reward), target in zip(path, targets(episode(*path), step_rules, stored), strict=True):
                actions = memory.setdefault(state, {})
                actions[action] = update_action_value(actions.get(action), action, target, reward, rule, rate)
    return {(s, a): v for s, actions in memory.items() for a, v in actions.items()}


def test_one_step_bootstrapping_learns_the_value_of_the_best_continuation() -> None:
    q = learn(cycles=30, n=1, rule="mean")
    assert q["s1", "c"].q == 1.0 and q["s1", "d"].q == -1.0 and q["s0", "b"].q == 0.0
    # Backward, Q(s0, a)'s first target is already 0.9 max(1) = 0.9, and every later one 0.9 max(1, -1): 60 visits.
    assert q["s0", "a"].visits == 60 and q["s0", "a"].q == pytest.approx(0.9)
    # Forward, its first target was 0 (s1 unknown when the first episode came), every later one 0.9.
    assert learn(cycles=30, n=1, rule="mean", order="forward")["s0", "a"].q == pytest.approx(0.9 * 59 / 60)
    # So "a" is encouraged at s0, "b" discouraged; at s1, "c" encouraged and "d" discouraged.
    encouraged, discouraged = action_advice([[q["s0", "a"], q["s0", "b"]]], 0.0)
    assert [a.action for a in encouraged] == ["a"] and [a.action for a in discouraged] == ["b"]


def test_the_first_success_encourages_its_early_step_only_when_credited_backward() -> None:
    cases: list[tuple[StepOrder, str]] = [("backward", "encouraged"), ("forward", "discouraged")]
    for order, advised in cases:
        q = learn(cycles=1, n=1, rule="mean", order=order, paths=PATHS[:1])  # one episode: [a c], a success
        encouraged, discouraged = action_advice([[q["s0", "a"]]], 0.0)
        assert [a.action for a in (encouraged if advised == "encouraged" else discouraged)] == ["a"], order


def test_two_steps_cover_the_episode_and_learn_the_average_return() -> None:
    # With n = 2 every target is the episode's discounted return, in either order: Q(s0, a) averages 0.9, -0.9.
    for order in ("backward", "forward"):
        q = learn(cycles=30, n=2, rule="mean", order=order)
        assert q["s0", "a"].q == pytest.approx(0.0, abs=1e-12) and q["s1", "c"].q == 1.0


def test_the_constant_rate_converges_to_the_same_values() -> None:
    for order in ("backward", "forward"):
        q = learn(cycles=300, n=1, rule="const", rate=0.1, order=order)
        assert q["s1", "c"].q == pytest.approx(1.0, abs=1e-9) and q["s1", "d"].q == pytest.approx(-1.0, abs=1e-9)
        assert q["s0", "a"].q == pytest.approx(0.9, abs=1e-9) and q["s0", "b"].q == 0.0
