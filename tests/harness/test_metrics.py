"""Metrics against hand-computed runs: success, CSR, forgetting, Q-critic r, partial epochs, types, files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from memrl_harness.metrics import (
    RunSummary,
    aggregate_seeds,
    mean_pairwise_similarity,
    pearson,
    q_critic_quality,
    summarize,
    write_summary,
)
from memrl_harness.results import EpisodeRecord, RunDir


def rec(epoch: int, task: str, success: bool, **extra: object) -> EpisodeRecord:
    fields: dict[str, object] = {"steps": 1, "wall_s": 1.0, "checker_reward": 1.0 if success else -1.0}
    fields.update(extra)
    return EpisodeRecord(epoch=epoch, position=0, task_id=task, success=success, **fields)


# 3 tasks x 3 epochs: a solved, forgotten, solved again; b learned in epoch 2; c only in epoch 3.
OUTCOMES = {1: (True, False, False), 2: (False, True, False), 3: (True, True, True)}


def three_by_three() -> list[EpisodeRecord]:
    out = []
    for epoch, wins in OUTCOMES.items():
        for i, (task, won) in enumerate(zip("abc", wins, strict=True)):
            out.append(
                rec(
                    epoch, task, won, steps=5 * (i + 1), prompt_tokens=100, completion_tokens=10 * epoch, wall_s=i + 1.0
                )
            )
    return out


def test_success_csr_forgetting_by_hand() -> None:
    s = summarize(three_by_three())
    assert s.tasks == 3
    assert [e.success_rate for e in s.epochs] == pytest.approx([1 / 3, 1 / 3, 1.0])
    assert [e.csr for e in s.epochs] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [e.partial for e in s.epochs] == [False, False, False]
    # 1 -> 2: a forgotten (1 of 3 tasks); 2 -> 3: nothing forgotten.
    assert [(t.to_epoch, t.solved_before, t.forgotten) for t in s.forgetting] == [(2, 1, 1), (3, 1, 0)]
    assert [t.rate for t in s.forgetting] == pytest.approx([1 / 3, 0.0])
    assert s.forgetting_rate == pytest.approx(1 / 6)
    assert [e.forgetting for e in s.epochs] == pytest.approx([None, 1 / 3, 0.0])
    assert (s.last_epoch, s.last_success) == (3, 1.0)
    assert (s.best_epoch, s.best_success) == (3, 1.0)
    assert s.final_csr == 1.0
    assert s.complete_epochs == 3 and s.partial_epoch is None


def test_cost_figures_per_epoch() -> None:
    s = summarize(three_by_three())
    e2 = s.epochs[1]
    assert e2.episodes == 3 and e2.successes == 1
    assert e2.mean_steps == pytest.approx(10.0)  # (5 + 10 + 15) / 3
    assert (e2.prompt_tokens, e2.completion_tokens) == (300, 60)
    assert (e2.prompt_tokens_per_episode, e2.completion_tokens_per_episode) == (100.0, 20.0)
    assert e2.wall_s == pytest.approx(6.0)
    assert e2.mean_checker_reward == pytest.approx(-1 / 3)
    assert s.episodes == 9
    assert (s.prompt_tokens, s.completion_tokens) == (900, 180)
    assert s.wall_s == pytest.approx(18.0)


def test_partial_last_epoch_stays_out_of_last_best_and_forgetting() -> None:
    records = [rec(1, "a", True), rec(1, "b", True), rec(1, "c", False), rec(1, "d", False)]
    records += [rec(2, "a", False), rec(2, "c", True)]  # killed after 2 of 4 tasks
    s = summarize(records)
    assert s.tasks == 4
    e2 = s.epochs[1]
    assert e2.partial and e2.episodes == 2 and e2.success_rate == 0.5
    assert e2.csr == pytest.approx(3 / 4)  # a, b, c
    t = s.forgetting[0]
    assert (t.solved_before, t.forgotten, t.complete) == (2, 1, False)  # b not run yet: not forgotten
    assert t.rate == pytest.approx(1 / 4)
    assert s.forgetting_rate is None
    assert s.partial_epoch == 2 and s.complete_epochs == 1
    assert (s.last_epoch, s.last_success) == (1, 0.5)
    assert s.best_epoch == 1
    assert s.final_csr == pytest.approx(3 / 4)


def test_given_task_count_marks_an_unfinished_first_epoch() -> None:
    s = summarize([rec(1, "a", True), rec(1, "b", False)], tasks=4)
    assert s.tasks == 4 and s.epochs[0].partial
    assert s.epochs[0].csr == pytest.approx(1 / 4)
    assert s.last_epoch is None and s.last_success is None and s.best_epoch is None


def test_best_epoch_prefers_the_earliest_tie_and_a_rerun_keeps_its_last_record() -> None:
    records = [rec(1, "a", True), rec(1, "b", False), rec(2, "a", False), rec(2, "b", True)]
    records.append(rec(2, "a", True))  # the same task recorded again in epoch 2: the last one counts
    s = summarize(records)
    assert s.epochs[1].episodes == 2 and s.epochs[1].success_rate == 1.0
    records[-1] = rec(2, "a", False)
    s = summarize(records)
    assert s.best_epoch == 1 and s.best_success == 0.5


def test_empty_run() -> None:
    s = summarize([], tasks=3)
    assert s.epochs == [] and s.final_csr == 0.0 and s.last_success is None and s.forgetting_rate is None


def test_per_task_type_success() -> None:
    records = [
        rec(1, "a", True, task_type="pick"),
        rec(1, "b", False, task_type="pick"),
        rec(1, "c", False, task_type="clean"),
        rec(2, "a", True, task_type="pick"),
        rec(2, "b", True, task_type="pick"),
        rec(2, "c", False, task_type="clean"),
    ]
    s = summarize(records)
    assert list(s.task_types) == ["clean", "pick"]
    assert [(m.epoch, m.episodes, m.successes, m.success_rate) for m in s.task_types["pick"]] == [
        (1, 2, 1, 0.5),
        (2, 2, 2, 1.0),
    ]
    assert [m.success_rate for m in s.task_types["clean"]] == [0.0, 0.0]
    assert summarize(three_by_three()).task_types == {}


def test_pearson_by_hand() -> None:
    # dx = (-1, 0, 1), dy = (-0.5, 0.5, 0): sum dx*dy = 0.5, sxx = 2, syy = 0.5 -> r = 0.5 / 1 = 0.5.
    assert pearson([1, 2, 3], [0, 1, 0.5]) == pytest.approx(0.5)
    assert pearson([1, 2], [0, 1]) is None
    assert pearson([0.1, 0.1, 0.1], [0, 1, 0.5]) is None
    assert pearson([1, 2, 3], [0.5, 0.5, 0.5]) is None


def q_critic_records() -> list[EpisodeRecord]:
    return [
        rec(1, "a", False, memory_ids=["m1", "m5"]),  # m1: 0/2 successes
        rec(1, "b", True, memory_ids=["m2", "m2"]),  # m2: 2/2 (a duplicate id counts once)
        rec(1, "c", True, memory_ids=["m3"]),  # m3: 1/2
        rec(2, "a", False, memory_ids=["m1"]),
        rec(2, "b", True, memory_ids=["m2"]),
        rec(2, "c", False, memory_ids=["m3", "m6"]),  # m6 injected once
    ]


def test_q_critic_r_by_hand() -> None:
    # m1 (q 1, rate 0), m2 (q 2, rate 1), m3 (q 3, rate 0.5): r = 0.5 as above.
    # m4 never injected, m5 has no final Q: both left out; m6 (q 9, rate 0) is in with min 1.
    q = {"m1": 1.0, "m2": 2.0, "m3": 3.0, "m4": 5.0}
    result = q_critic_quality(q_critic_records(), q)
    assert result.n == 3 and result.r == pytest.approx(0.5)
    with_m6 = q_critic_quality(q_critic_records(), {**q, "m6": 9.0}, min_injections=2)
    assert with_m6.n == 3 and with_m6.r == pytest.approx(0.5)  # m6 injected once: out
    assert q_critic_quality(q_critic_records(), {**q, "m6": 9.0}).n == 4
    assert summarize(q_critic_records(), q_values=q).q_critic == result
    assert summarize(q_critic_records()).q_critic is None


def test_q_critic_none_cases() -> None:
    few = q_critic_quality(q_critic_records(), {"m1": 1.0, "m2": 2.0})
    assert (few.r, few.n) == (None, 2)
    flat = q_critic_quality(q_critic_records(), {"m1": 0.3, "m2": 0.3, "m3": 0.3})
    assert (flat.r, flat.n) == (None, 3)
    strict = q_critic_quality(q_critic_records(), {"m1": 1.0, "m2": 2.0, "m3": 3.0}, min_injections=3)
    assert (strict.r, strict.n, strict.min_injections) == (None, 0, 3)


def test_write_summary_json_and_csv(tmp_path: Path) -> None:
    records = [r.model_copy(update={"task_type": "pick" if r.task_id != "c" else "clean"}) for r in three_by_three()]
    s = summarize(records, q_values={"m1": 1.0}, epochs_planned=3)
    run = RunDir(tmp_path / "run")
    write_summary(run, s)
    assert RunSummary.model_validate_json(run.summary_json.read_text()) == s
    assert json.loads(run.summary_json.read_text())["forgetting_rate"] == pytest.approx(1 / 6)
    with run.summary_csv.open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = reader.fieldnames
    assert header is not None
    assert header[:7] == ["epoch", "episodes", "tasks", "partial", "successes", "success_rate", "csr"]
    assert header[-2:] == ["success_rate[clean]", "success_rate[pick]"]
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert [float(r["success_rate"]) for r in rows] == pytest.approx([1 / 3, 1 / 3, 1.0], abs=1e-6)
    assert [float(r["csr"]) for r in rows] == pytest.approx([1 / 3, 2 / 3, 1.0], abs=1e-6)
    assert rows[0]["forgetting"] == ""
    assert float(rows[1]["forgetting"]) == pytest.approx(1 / 3, abs=1e-6)
    assert [float(r["success_rate[pick]"]) for r in rows] == [0.5, 0.5, 1.0]
    assert [float(r["success_rate[clean]"]) for r in rows] == [0.0, 0.0, 1.0]
    assert rows[1]["prompt_tokens"] == "300" and rows[1]["completion_tokens"] == "60"
    write_summary(tmp_path / "plain", s)  # a bare path works too
    assert (tmp_path / "plain" / "summary.csv").exists()


def test_mean_pairwise_similarity_by_hand() -> None:
    # Unit vectors a = (1, 0), b = (0, 1), c = (1, 1)/sqrt 2: cos ab 0, ac and bc 1/sqrt 2 -> mean sqrt(2)/3.
    vectors = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    assert mean_pairwise_similarity(vectors) == pytest.approx(2**0.5 / 3)
    rows = np.random.default_rng(0).normal(size=(40, 8))
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    pairs = [unit[i] @ unit[j] for i in range(40) for j in range(40) if i != j]
    assert mean_pairwise_similarity(rows) == pytest.approx(sum(pairs) / len(pairs))
    assert mean_pairwise_similarity(vectors[:1]) is None


def test_seeds_aggregate_by_hand() -> None:
    # Seed 0: epoch 1 a; epoch 2 a, b. Seed 1: nothing, then all three, then a partial epoch 3.
    seed0 = [rec(1, "a", True), rec(1, "b", False), rec(1, "c", False)]
    seed0 += [rec(2, "a", True), rec(2, "b", True), rec(2, "c", False)]
    seed1 = [rec(1, t, False) for t in "abc"] + [rec(2, t, True) for t in "abc"] + [rec(3, "a", True)]
    aggregate = aggregate_seeds([0, 1], [summarize(seed0), summarize(seed1)])
    assert aggregate.seeds == [0, 1]
    assert [e.epoch for e in aggregate.epochs] == [1, 2]  # the partial epoch 3 counts for no seed
    first = aggregate.epochs[0].success_rate
    assert (first.mean, first.std, first.n) == pytest.approx((1 / 6, (2 * (1 / 6) ** 2) ** 0.5, 2))
    assert aggregate.last_success is not None and aggregate.last_success.mean == pytest.approx(5 / 6)
    assert aggregate.last_csr is not None and aggregate.last_csr.mean == pytest.approx(5 / 6)
    # Forgetting: seed 0 forgot nothing, seed 1 nothing (its epoch 3 is partial): 0 +- 0 over 2.
    assert aggregate.forgetting_rate is not None and aggregate.forgetting_rate.n == 2
    assert aggregate.q_critic_r is None and aggregate.transfer_success is None
    one = aggregate_seeds([4], [summarize(seed0)])
    assert one.last_success is not None and one.last_success.std is None and one.last_success.n == 1
