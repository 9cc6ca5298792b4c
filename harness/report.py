"""``memrl-harness report RUN...``: one markdown report and learning-curve plots over several runs.

Each run folder gives its settings (``run.json``), its episodes and, for memrl runs, the final Q of
the memories it injected (``q_values.json``). Runs of one benchmark share a plot, so the modes
(none / rag / memrl) on the same tasks can be compared at a glance.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.metrics import RunSummary, summarize, write_summary
from harness.results import Q_VALUES_FILE, EpisodeRecord, RunConfig, RunDir

REPORT_FILE = "report.md"
NA = "n/a"  # a figure that does not exist for this run (no whole epoch, no Q values, ...)


@dataclass
class LoadedRun:
    """One run as the report sees it."""

    path: Path
    config: RunConfig
    episodes: list[EpisodeRecord]
    q_values: dict[str, float] | None
    summary: RunSummary
    label: str = ""


def read_q_values(path: Path) -> dict[str, float] | None:
    """memory id -> final Q; None when the run wrote none (runs without memory, or killed early)."""
    file = path / Q_VALUES_FILE
    if not file.exists():
        return None
    raw = json.loads(file.read_text())
    return {str(k): float(v["q"] if isinstance(v, dict) else v) for k, v in raw.items()}


def task_count(config: RunConfig, episodes: Sequence[EpisodeRecord]) -> int | None:
    """The task list's length: the ids seen once a second epoch began, else the configured K.

    Before epoch 2 the ids seen may undercount an unfinished first epoch, and ``config.tasks`` is
    the best bound there is (it can overcount when K exceeds the benchmark's size).
    """
    if any(r.epoch > 1 for r in episodes):
        return None
    return config.tasks


def load_run(path: Path, *, min_injections: int = 1) -> LoadedRun:
    run = RunDir(path)
    config = run.read_config()
    episodes = run.episodes()
    q_values = read_q_values(path)
    summary = summarize(
        episodes,
        tasks=task_count(config, episodes),
        q_values=q_values,
        min_injections=min_injections,
        epochs_planned=config.epochs,
    )
    return LoadedRun(path=path, config=config, episodes=episodes, q_values=q_values, summary=summary)


def assign_labels(runs: Sequence[LoadedRun]) -> None:
    """Label by mode, adding benchmark and model only where they differ, and the folder on a tie."""
    benchmarks = {r.config.benchmark for r in runs}
    models = {r.config.model for r in runs}
    for run in runs:
        parts: list[str] = [run.config.mode]
        if len(benchmarks) > 1:
            parts.append(run.config.benchmark)
        if len(models) > 1:
            parts.append(run.config.model or "no model")
        run.label = " / ".join(parts)
    counts: dict[str, int] = defaultdict(int)
    for run in runs:
        counts[run.label] += 1
    for run in runs:
        if counts[run.label] > 1:
            run.label = f"{run.label} ({run.path.name})"


def _rate(value: float | None) -> str:
    return NA if value is None else f"{value:.3f}"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _epochs_cell(s: RunSummary) -> str:
    text = f"{s.complete_epochs}/{s.epochs_planned}" if s.epochs_planned else str(s.complete_epochs)
    if s.partial_epoch is not None:
        done = s.epochs[-1]
        text += f" + partial ({done.episodes}/{done.tasks})"
    return text


def _q_cell(s: RunSummary) -> str:
    if s.q_critic is None:
        return NA
    return f"{_rate(s.q_critic.r)} (n={s.q_critic.n})"


def run_table(runs: Sequence[LoadedRun]) -> list[str]:
    header = [
        "run",
        "benchmark",
        "mode",
        "model",
        "epochs",
        "tasks",
        "last-epoch success",
        "best epoch",
        "final CSR",
        "forgetting",
        "Q-critic r",
        "mean steps",
        "tokens (prompt + completion)",
        "wall s (sum)",
    ]
    rows = []
    for run in runs:
        s = run.summary
        rows.append(
            [
                run.label,
                run.config.benchmark,
                run.config.mode,
                run.config.model or NA,
                _epochs_cell(s),
                s.tasks,
                _rate(s.last_success),
                NA if s.best_epoch is None else f"{s.best_epoch} ({_rate(s.best_success)})",
                _rate(s.final_csr),
                _rate(s.forgetting_rate),
                _q_cell(s),
                f"{s.mean_steps:.2f}",
                f"{s.prompt_tokens + s.completion_tokens} ({s.prompt_tokens} + {s.completion_tokens})",
                f"{s.wall_s:.1f}",
            ]
        )
    return _table(header, rows)


def epoch_table(runs: Sequence[LoadedRun]) -> list[str]:
    header = ["run", "epoch", "episodes", "success", "CSR", "forgetting", "mean steps", "tokens / episode", "wall s"]
    rows = []
    for run in runs:
        for e in run.summary.epochs:
            rows.append(
                [
                    run.label,
                    f"{e.epoch} (partial)" if e.partial else e.epoch,
                    f"{e.episodes}/{e.tasks}",
                    _rate(e.success_rate),
                    _rate(e.csr),
                    _rate(e.forgetting),
                    f"{e.mean_steps:.2f}",
                    f"{e.prompt_tokens_per_episode + e.completion_tokens_per_episode:.0f}",
                    f"{e.wall_s:.1f}",
                ]
            )
    return _table(header, rows)


def type_table(runs: Sequence[LoadedRun]) -> list[str]:
    """Success per task type and epoch; empty when no run recorded types."""
    typed = [r for r in runs if r.summary.task_types]
    if not typed:
        return []
    last = max(e.epoch for r in typed for e in r.summary.epochs)
    header = ["run", "task type", *(f"epoch {t}" for t in range(1, last + 1))]
    rows = []
    for run in typed:
        for task_type, per_epoch in run.summary.task_types.items():
            by_epoch = {m.epoch: m for m in per_epoch}
            cells = [
                f"{_rate(by_epoch[t].success_rate)} ({by_epoch[t].successes}/{by_epoch[t].episodes})"
                if t in by_epoch
                else NA
                for t in range(1, last + 1)
            ]
            rows.append([run.label, task_type, *cells])
    return _table(header, rows)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "benchmark"


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def plot_metric(runs: Sequence[LoadedRun], metric: str, name: str, title: str, out: Path) -> None:
    """One line per run over epochs (markers and dashes differ, so equal curves stay visible).

    A partial epoch's point is drawn hollow: it is a share of the tasks done so far.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    try:
        any_partial = False
        for i, run in enumerate(runs):
            epochs = run.summary.epochs
            if not epochs:
                continue
            xs = [e.epoch for e in epochs]
            ys = [getattr(e, metric) for e in epochs]
            (line,) = ax.plot(
                xs,
                ys,
                marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)],
                alpha=0.9,
                label=run.label,
            )
            partial = [(e.epoch, getattr(e, metric)) for e in epochs if e.partial]
            if partial:
                any_partial = True
                ax.plot(
                    [p[0] for p in partial],
                    [p[1] for p in partial],
                    linestyle="none",
                    marker=MARKERS[i % len(MARKERS)],
                    markersize=9,
                    markerfacecolor="white",
                    color=line.get_color(),
                )
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if any_partial:
            hollow = Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", color="grey")
            handles, labels = [*handles, hollow], [*labels, "partial epoch"]
        if handles:
            ax.legend(handles, labels, loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)


def build_report(
    run_dirs: Sequence[Path], out_dir: Path, *, min_injections: int = 1, write_summaries: bool = True
) -> Path:
    """Write ``report.md`` and per-benchmark PNG curves under ``out_dir``; return the report's path.

    With ``write_summaries`` each run folder also gets its ``summary.json`` / ``summary.csv``.
    """
    if not run_dirs:
        raise ValueError("report needs at least one run folder")
    runs = [load_run(Path(p), min_injections=min_injections) for p in run_dirs]
    assign_labels(runs)
    if write_summaries:
        for run in runs:
            write_summary(run.path, run.summary)
    out_dir.mkdir(parents=True, exist_ok=True)

    by_benchmark: dict[str, list[LoadedRun]] = defaultdict(list)
    for run in runs:
        by_benchmark[run.config.benchmark].append(run)

    lines = ["# memrl-harness report", ""]
    lines += ["Success rates are per epoch; CSR(t) = tasks solved at least once in epochs 1..t / tasks."]
    lines += ["Forgetting = tasks solved in epoch t-1 and failed in t, over all tasks, averaged over t."]
    lines += ["A partial (unfinished) last epoch is left out of last-epoch success, best epoch and forgetting.", ""]
    lines += ["## Runs", "", *run_table(runs), ""]
    lines += ["## Per epoch", "", *epoch_table(runs), ""]
    types = type_table(runs)
    if types:
        lines += ["## Per task type (success rate per epoch)", "", *types, ""]
    lines += ["## Curves", ""]
    for benchmark, group in by_benchmark.items():
        slug = _slug(benchmark)
        for metric, name, file in (
            ("success_rate", "success rate", f"success_rate_{slug}.png"),
            ("csr", "CSR", f"csr_{slug}.png"),
        ):
            plot_metric(group, metric, name, f"{benchmark}: {name} per epoch", out_dir / file)
            lines += [f"![{benchmark} {name}]({file})", ""]
    report = out_dir / REPORT_FILE
    report.write_text("\n".join(lines))
    return report
