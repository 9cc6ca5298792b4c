"""Learning-curve metrics of one run, from its episode records (docs/algorithm.md, "The benchmark protocol").

Pure functions: the records of several epochs over the same task list go in, a typed summary comes
out. A run killed mid-epoch is fine: its last epoch is marked ``partial`` and kept out of the
figures that need a whole epoch ("Last", best epoch, the forgetting mean).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from memrl_harness.results import EpisodeRecord, RunConfig, RunDir
from memrl_mcp.curves import CurvePoint, RunCurve


class EpochMetrics(BaseModel):
    """One epoch (the paper's "section")."""

    epoch: int
    episodes: int
    tasks: int = Field(description="Tasks in the run; an epoch with fewer episodes is partial.")
    partial: bool
    successes: int
    success_rate: float = Field(description="Successes / episodes of this epoch (of those done, when partial).")
    csr: float = Field(description="Tasks solved at least once in epochs 1..t / tasks.")
    forgetting: float | None = Field(
        None, description="Rate of the transition from epoch t-1 into t; None for the first."
    )
    mean_checker_reward: float
    mean_steps: float
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_per_episode: float
    completion_tokens_per_episode: float
    wall_s: float = Field(description="Sum of episode wall times (more than elapsed time with several workers).")


class ForgettingTransition(BaseModel):
    """Tasks solved in epoch ``to_epoch - 1`` and failed in ``to_epoch``."""

    to_epoch: int
    solved_before: int
    forgotten: int
    rate: float = Field(description="forgotten / tasks (all tasks, as the paper's forgetting rate).")
    complete: bool = Field(description="Both epochs whole; only these enter the mean.")


class TypeEpochMetrics(BaseModel):
    """Success of one task type in one epoch (ALFWorld reports per type)."""

    epoch: int
    episodes: int
    successes: int
    success_rate: float


class QCriticQuality(BaseModel):
    """Pearson r between a memory's final Q and the success rate of the episodes it was injected into."""

    r: float | None = Field(description="None with fewer than 3 memories or a constant Q or success rate.")
    n: int = Field(description="Memories that entered r.")
    min_injections: int


class RunSummary(BaseModel):
    """Everything the report shows about one run."""

    tasks: int
    epochs_planned: int | None = None
    epochs: list[EpochMetrics]
    complete_epochs: int
    partial_epoch: int | None = Field(None, description="The last epoch, when it has fewer episodes than tasks.")
    last_epoch: int | None = Field(None, description="Last whole epoch (the paper's 'Last'); None if none is whole.")
    last_success: float | None
    last_third_success: float | None = Field(
        None, description="Mean success of the last third of the whole epochs (the last ceil(n/3) of n)."
    )
    best_epoch: int | None = Field(None, description="Whole epoch of highest success (earliest on ties).")
    best_success: float | None
    final_csr: float = Field(description="CSR after every recorded episode (a partial epoch only adds to it).")
    forgetting_rate: float | None = Field(description="Mean over whole transitions; None with fewer than 2.")
    forgetting: list[ForgettingTransition]
    task_types: dict[str, list[TypeEpochMetrics]] = Field(default_factory=dict)
    q_critic: QCriticQuality | None = None
    episodes: int
    recalls: int = Field(0, description="Episodes that logged a recall (recall_experience).")
    recalls_reported: int = Field(0, description="Of those, the episodes whose recall was reported.")
    q_updates: int = Field(0, description="Q values moved by the reports: what the memory learned from.")
    reward_sources: dict[str, int] = Field(
        default_factory=dict, description="Reports by what decided their reward (agent, user, tests, ...)."
    )
    claims_overruled: int = Field(0, description="Reports whose reward is not the one the agent claimed.")
    mean_steps: float
    prompt_tokens: int
    completion_tokens: int
    wall_s: float


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def latest_per_task(records: Iterable[EpisodeRecord]) -> dict[int, dict[str, EpisodeRecord]]:
    """Records by epoch then task id; a task recorded twice in one epoch keeps its last record."""
    by_epoch: dict[int, dict[str, EpisodeRecord]] = defaultdict(dict)
    for record in records:
        by_epoch[record.epoch][record.task_id] = record
    return dict(sorted(by_epoch.items()))


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson r, or None when it is undefined (fewer than 3 points, or either side constant)."""
    if len(xs) != len(ys):
        raise ValueError("pearson needs two sequences of the same length")
    if len(xs) < 3 or min(xs) == max(xs) or min(ys) == max(ys):
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def q_critic_quality(
    records: Iterable[EpisodeRecord], q_values: Mapping[str, float], *, min_injections: int = 1
) -> QCriticQuality:
    """Does a high Q mean the memory helps? r over memories injected at least ``min_injections`` times.

    A memory counts once per episode it was injected into, in every epoch; memories with no final Q
    (forgotten since) or never injected are left out.
    """
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        for memory_id in dict.fromkeys(record.memory_ids):
            outcomes[memory_id].append(record.success)
    used = sorted(m for m, seen in outcomes.items() if m in q_values and len(seen) >= max(min_injections, 1))
    qs = [float(q_values[m]) for m in used]
    rates = [_mean([float(s) for s in outcomes[m]]) for m in used]
    return QCriticQuality(r=pearson(qs, rates), n=len(used), min_injections=min_injections)


def forgetting_transitions(
    by_epoch: Mapping[int, Mapping[str, EpisodeRecord]], tasks: int
) -> list[ForgettingTransition]:
    """One transition per epoch t >= 2 (whose t-1 was recorded).

    The denominator is every task, not only those solved in t-1: that is the paper's "share of
    tasks solved in t-1 and failed in t", and it keeps runs that solve little from looking
    forgetful. ``solved_before`` gives the conditional rate where wanted. A task not yet run in a
    partial epoch t is not counted as forgotten.
    """
    out = []
    for epoch, now in by_epoch.items():
        before = by_epoch.get(epoch - 1)
        if before is None:
            continue
        solved = {t for t, r in before.items() if r.success}
        forgotten = sum(1 for t in solved if t in now and not now[t].success)
        out.append(
            ForgettingTransition(
                to_epoch=epoch,
                solved_before=len(solved),
                forgotten=forgotten,
                rate=forgotten / tasks,
                complete=len(before) >= tasks and len(now) >= tasks,
            )
        )
    return out


def summarize(
    records: Sequence[EpisodeRecord],
    *,
    tasks: int | None = None,
    q_values: Mapping[str, float] | None = None,
    min_injections: int = 1,
    epochs_planned: int | None = None,
) -> RunSummary:
    """The run's summary. ``tasks`` defaults to the distinct task ids seen in any epoch.

    Give ``tasks`` when the first epoch may be unfinished (the ids seen then undercount the list).
    ``q_values`` (memory id -> final Q) enables the Q-critic figure.
    """
    by_epoch = latest_per_task(records)
    seen = {task for epoch in by_epoch.values() for task in epoch}
    n_tasks = max(tasks or 0, len(seen), 1)
    kept = [r for epoch in by_epoch.values() for r in epoch.values()]
    transitions = forgetting_transitions(by_epoch, n_tasks)
    forgetting_into = {t.to_epoch: t.rate for t in transitions}

    epochs: list[EpochMetrics] = []
    solved: set[str] = set()
    types: dict[str, list[TypeEpochMetrics]] = defaultdict(list)
    for epoch, done in by_epoch.items():
        rows = list(done.values())
        solved |= {t for t, r in done.items() if r.success}
        successes = sum(r.success for r in rows)
        epochs.append(
            EpochMetrics(
                epoch=epoch,
                episodes=len(rows),
                tasks=n_tasks,
                partial=len(rows) < n_tasks,
                successes=successes,
                success_rate=successes / len(rows),
                csr=len(solved) / n_tasks,
                forgetting=forgetting_into.get(epoch),
                mean_checker_reward=_mean([r.checker_reward for r in rows]),
                mean_steps=_mean([r.steps for r in rows]),
                prompt_tokens=sum(r.prompt_tokens for r in rows),
                completion_tokens=sum(r.completion_tokens for r in rows),
                prompt_tokens_per_episode=_mean([r.prompt_tokens for r in rows]),
                completion_tokens_per_episode=_mean([r.completion_tokens for r in rows]),
                wall_s=sum(r.wall_s for r in rows),
            )
        )
        per_type: dict[str, list[EpisodeRecord]] = defaultdict(list)
        for r in rows:
            if r.task_type is not None:
                per_type[r.task_type].append(r)
        for task_type, group in per_type.items():
            wins = sum(r.success for r in group)
            types[task_type].append(
                TypeEpochMetrics(epoch=epoch, episodes=len(group), successes=wins, success_rate=wins / len(group))
            )

    whole = [e for e in epochs if not e.partial]
    best = max(whole, key=lambda e: (e.success_rate, -e.epoch), default=None)
    whole_forgetting = [t.rate for t in transitions if t.complete]
    return RunSummary(
        tasks=n_tasks,
        epochs_planned=epochs_planned,
        epochs=epochs,
        complete_epochs=len(whole),
        partial_epoch=epochs[-1].epoch if epochs and epochs[-1].partial else None,
        last_epoch=whole[-1].epoch if whole else None,
        last_success=whole[-1].success_rate if whole else None,
        last_third_success=_mean([e.success_rate for e in whole[-math.ceil(len(whole) / 3) :]]) if whole else None,
        best_epoch=best.epoch if best else None,
        best_success=best.success_rate if best else None,
        final_csr=epochs[-1].csr if epochs else 0.0,
        forgetting_rate=_mean(whole_forgetting) if whole_forgetting else None,
        forgetting=transitions,
        task_types=dict(sorted(types.items())),
        q_critic=q_critic_quality(kept, q_values, min_injections=min_injections) if q_values is not None else None,
        episodes=len(kept),
        recalls=sum(r.recall_by is not None for r in kept),
        recalls_reported=sum(r.report_by is not None for r in kept),
        q_updates=sum(r.q_updates for r in kept),
        reward_sources=dict(sorted(Counter(r.reward_source for r in kept if r.reward_source).items())),
        claims_overruled=sum(
            r.claimed_reward is not None and r.learned_reward is not None and r.claimed_reward != r.learned_reward
            for r in kept
        ),
        mean_steps=_mean([r.steps for r in kept]),
        prompt_tokens=sum(r.prompt_tokens for r in kept),
        completion_tokens=sum(r.completion_tokens for r in kept),
        wall_s=sum(r.wall_s for r in kept),
    )


class TaskSimilarity(BaseModel):
    """A benchmark's intra-dataset query similarity (the paper relates it to MemRL's gain: ALFWorld 0.518 with
    +0.229, HLE 0.186 with +0.216, with text-embedding-3-large)."""

    embedder: str
    tasks: int
    mean_pairwise: float | None = Field(description="Mean cosine over distinct task pairs; None below 2 tasks.")


def mean_pairwise_similarity(vectors: np.ndarray) -> float | None:
    """Mean cosine similarity over the distinct pairs of rows (rows are normalised here)."""
    n = len(vectors)
    if n < 2:
        return None
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    total = unit.sum(axis=0)
    # Sum over all ordered pairs = |sum of rows|^2; take the diagonal (n ones) away. O(n d), not O(n^2 d).
    return float((total @ total - n) / (n * (n - 1)))


class Spread(BaseModel):
    """A figure over seeds: mean, sample standard deviation (None for one seed) and how many seeds."""

    mean: float
    std: float | None
    n: int


def spread(values: Sequence[float]) -> Spread | None:
    if not values:
        return None
    return Spread(mean=_mean(values), std=statistics.stdev(values) if len(values) > 1 else None, n=len(values))


class EpochSpread(BaseModel):
    """One epoch over the seeds whose run finished it."""

    epoch: int
    success_rate: Spread
    csr: Spread


class SeedAggregate(BaseModel):
    """Runs that differ only in their seed, taken together."""

    seeds: list[int]
    epochs: list[EpochSpread] = Field(description="Whole epochs only; each says how many seeds finished it.")
    last_success: Spread | None = Field(description="Success in each run's last whole epoch.")
    last_third_success: Spread | None = Field(None, description="Each run's mean success over its last third.")
    last_csr: Spread | None = Field(description="CSR at each run's last whole epoch.")
    forgetting_rate: Spread | None
    q_critic_r: Spread | None
    transfer_success: Spread | None = Field(None, description="Success on the held-out tasks (transfer runs).")


def aggregate_seeds(
    seeds: Sequence[int], summaries: Sequence[RunSummary], transfer: Sequence[RunSummary | None] = ()
) -> SeedAggregate:
    """Mean and spread per epoch and of the headline figures; a run without a figure (no whole epoch, no Q)
    is left out of that figure's n only."""
    per_epoch: dict[int, list[EpochMetrics]] = defaultdict(list)
    for summary in summaries:
        for epoch in summary.epochs:
            if not epoch.partial:
                per_epoch[epoch.epoch].append(epoch)
    lasts = [next(e for e in reversed(s.epochs) if not e.partial) for s in summaries if s.last_epoch is not None]
    epochs = [
        EpochSpread(
            epoch=epoch,
            success_rate=spread([e.success_rate for e in rows]),
            csr=spread([e.csr for e in rows]),
        )
        for epoch, rows in sorted(per_epoch.items())
    ]
    return SeedAggregate(
        seeds=list(seeds),
        epochs=epochs,
        last_success=spread([e.success_rate for e in lasts]),
        last_third_success=spread([s.last_third_success for s in summaries if s.last_third_success is not None]),
        last_csr=spread([e.csr for e in lasts]),
        forgetting_rate=spread([s.forgetting_rate for s in summaries if s.forgetting_rate is not None]),
        q_critic_r=spread([s.q_critic.r for s in summaries if s.q_critic and s.q_critic.r is not None]),
        transfer_success=spread([t.last_success for t in transfer if t is not None and t.last_success is not None]),
    )


CSV_COLUMNS = [
    "epoch",
    "episodes",
    "tasks",
    "partial",
    "successes",
    "success_rate",
    "csr",
    "forgetting",
    "mean_checker_reward",
    "mean_steps",
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_per_episode",
    "completion_tokens_per_episode",
    "wall_s",
]


def csv_rows(summary: RunSummary) -> tuple[list[str], list[dict[str, object]]]:
    """One row per epoch; per-type success as extra ``success_rate[<type>]`` columns."""
    type_columns = {t: f"success_rate[{t}]" for t in summary.task_types}
    rows: list[dict[str, object]] = []
    for epoch in summary.epochs:
        row: dict[str, object] = {c: getattr(epoch, c) for c in CSV_COLUMNS}
        row["forgetting"] = "" if epoch.forgetting is None else epoch.forgetting
        for task_type, column in type_columns.items():
            match = [m for m in summary.task_types[task_type] if m.epoch == epoch.epoch]
            row[column] = match[0].success_rate if match else ""
        rows.append(row)
    return [*CSV_COLUMNS, *type_columns.values()], rows


def task_count(config: RunConfig, episodes: Sequence[EpisodeRecord]) -> int | None:
    """The task list's length: the ids seen once a second epoch began, else the configured K.

    Before epoch 2 the ids seen may undercount an unfinished first epoch, and ``config.tasks`` is
    the best bound there is (it can overcount when K exceeds the benchmark's size).
    """
    if any(r.epoch > 1 for r in episodes):
        return None
    return config.tasks


def write_curve(run_dir: RunDir, config: RunConfig) -> None:
    """The run's learning curve so far (``curve.json``, memrl-mcp's format: the ``/ui`` inspector draws it)."""
    episodes = run_dir.episodes()
    summary = summarize(episodes, tasks=task_count(config, episodes), epochs_planned=config.epochs)
    RunCurve(
        benchmark=config.benchmark,
        setting=config.setting,
        label=config.mode_label,
        seed=config.seed,
        success_rate=[CurvePoint(epoch=e.epoch, value=e.success_rate, partial=e.partial) for e in summary.epochs],
        csr=[CurvePoint(epoch=e.epoch, value=e.csr, partial=e.partial) for e in summary.epochs],
    ).write(run_dir.path)


def write_summary(run_dir: RunDir | Path, summary: RunSummary) -> None:
    """``summary.json`` (the whole summary) and ``summary.csv`` (one row per epoch) in the run folder."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    run.make()
    run.summary_json.write_text(summary.model_dump_json(indent=2) + "\n")
    columns, rows = csv_rows(summary)
    with run.summary_csv.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})


def _csv_value(value: object) -> object:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 6)
    return value
