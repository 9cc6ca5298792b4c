"""``memrl-harness report RUN...``: one markdown report and learning-curve plots over several runs.

Each run folder gives its settings (``run.json``), its episodes, for memrl runs the final Q of the
memories it injected (``q_values.json``), for transfer runs the evaluation on held-out tasks
(``transfer/``), and the benchmark's intra-dataset query similarity (``task_similarity.json``).
Runs that differ only in their seed form one *setting*: the report gives its mean and spread per
epoch and of the headline figures, with the number of seeds behind each, and draws it as a mean
curve with a +-1 standard deviation band. Runs of one benchmark share a plot, so the modes on the
same tasks can be compared at a glance.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from memrl_harness.metrics import (
    RunSummary,
    SeedAggregate,
    Spread,
    TaskSimilarity,
    aggregate_seeds,
    summarize,
    task_count,
    write_curve,
    write_summary,
)
from memrl_harness.results import Q_VALUES_FILE, EpisodeRecord, RunConfig, RunDir

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
    transfer: RunSummary | None = None
    similarity: TaskSimilarity | None = None
    label: str = ""


@dataclass
class Setting:
    """Runs that differ only in their seed."""

    runs: list[LoadedRun]
    aggregate: SeedAggregate
    label: str = ""

    @property
    def config(self) -> RunConfig:
        return self.runs[0].config


def read_q_values(path: Path) -> dict[str, float] | None:
    """memory id -> final Q; None when the run wrote none (runs without memory, or killed early)."""
    file = path / Q_VALUES_FILE
    if not file.exists():
        return None
    raw = json.loads(file.read_text())
    return {str(k): float(v["q"] if isinstance(v, dict) else v) for k, v in raw.items()}


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
    transfer = None
    if config.transfer is not None and run.transfer.episodes_file.exists():
        transfer = summarize(run.transfer.episodes(), epochs_planned=1)
    similarity = (
        TaskSimilarity.model_validate_json(run.similarity_file.read_text()) if run.similarity_file.exists() else None
    )
    return LoadedRun(
        path=path,
        config=config,
        episodes=episodes,
        q_values=q_values,
        summary=summary,
        transfer=transfer,
        similarity=similarity,
    )


def settings_of(runs: Sequence[LoadedRun]) -> list[Setting]:
    """Runs grouped by everything in their config but the seed, in the order first seen."""
    groups: dict[str, list[LoadedRun]] = defaultdict(list)
    for run in runs:
        groups[run.config.model_copy(update={"seed": 0}).model_dump_json()].append(run)
    settings = []
    for group in groups.values():
        transfer = [r.transfer for r in group] if group[0].config.transfer else []
        aggregate = aggregate_seeds([r.config.seed for r in group], [r.summary for r in group], transfer)
        settings.append(Setting(group, aggregate))
    labels = _labels([setting.config for setting in settings])
    tied = {label for label, count in Counter(labels).items() if count > 1}
    seen: Counter[str] = Counter()
    for setting, label in zip(settings, labels, strict=True):  # same label, other options (tasks, epochs...): numbered
        seen[label] += 1
        setting.label = f"{label} #{seen[label]}" if label in tied else label
    return settings


def assign_labels(runs: Sequence[LoadedRun]) -> None:
    """Label by mode, adding benchmark and model only where they differ, and the folder on a tie."""
    labels = _labels([run.config for run in runs])
    tied = {label for label, count in Counter(labels).items() if count > 1}
    for run, label in zip(runs, labels, strict=True):
        run.label = f"{label} ({run.path.name})" if label in tied else label


def _labels(configs: Sequence[RunConfig]) -> list[str]:
    """Each config's mode, with its benchmark and its model where those differ among ``configs``."""
    benchmarks = {config.benchmark for config in configs}
    models = {config.model for config in configs}
    return [
        " / ".join(
            [config.mode_label]
            + ([config.benchmark] if len(benchmarks) > 1 else [])
            + ([config.model or "no model"] if len(models) > 1 else [])
        )
        for config in configs
    ]


def _rate(value: float | None) -> str:
    return NA if value is None else f"{value:.3f}"


def _spread(value: Spread | None) -> str:
    """mean +- std (n), the n seeds behind the figure."""
    if value is None:
        return NA
    std = "" if value.std is None else f" ± {value.std:.3f}"
    return f"{value.mean:.3f}{std} (n={value.n})"


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
        "held-out success",
        "recalls reported",
        "Q updates",
        "rewards by source",
        "claims overruled",
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
                _rate(run.transfer.last_success) if run.transfer else NA,
                f"{s.recalls_reported}/{s.recalls}" if s.recalls else NA,
                s.q_updates,
                ", ".join(f"{source} {n}" for source, n in s.reward_sources.items()) or NA,
                s.claims_overruled if s.reward_sources else NA,
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


def setting_table(settings: Sequence[Setting]) -> list[str]:
    header = [
        "setting",
        "seeds",
        "last-epoch success",
        "last third's success",
        "CSR at last epoch",
        "forgetting",
        "Q-critic r",
        "held-out success (transfer)",
    ]
    rows = []
    for setting in settings:
        a = setting.aggregate
        rows.append(
            [
                setting.label,
                ", ".join(map(str, a.seeds)),
                _spread(a.last_success),
                _spread(a.last_third_success),
                _spread(a.last_csr),
                _spread(a.forgetting_rate),
                _spread(a.q_critic_r),
                _spread(a.transfer_success) if setting.config.transfer else NA,
            ]
        )
    return _table(header, rows)


def setting_epoch_table(settings: Sequence[Setting]) -> list[str]:
    header = ["setting", "epoch", "success", "CSR"]
    rows = [
        [setting.label, e.epoch, _spread(e.success_rate), _spread(e.csr)]
        for setting in settings
        for e in setting.aggregate.epochs
    ]
    return _table(header, rows)


def similarity_table(settings: Sequence[Setting]) -> list[str]:
    """Per benchmark setting: its tasks' mean pairwise similarity next to MemRL's last-epoch gain over each
    baseline run on the same tasks (means over seeds; the paper: ALFWorld 0.518 -> +0.229, HLE 0.186 -> +0.216)."""
    by_tasks: dict[str, list[Setting]] = defaultdict(list)
    for setting in settings:
        if setting.config.transfer is None:
            baseline = {"mode": "none", "trials": None, "discipline": "disciplined", "lapse_rate": None}
            baseline |= {"judgement": "honest", "evidence": "none"}
            same = setting.config.model_copy(update={"seed": 0, "memory_config": None, **baseline})
            by_tasks[same.model_dump_json()].append(setting)
    header = ["benchmark", "tasks", "embedder", "mean pairwise similarity", "memrl last-epoch success", "gain over"]
    rows = []
    for group in by_tasks.values():
        memrl = next(
            (
                s
                for s in group
                if s.config.mode == "memrl"
                and (s.config.discipline, s.config.judgement, s.config.evidence) == ("disciplined", "honest", "none")
                and s.aggregate.last_success
            ),
            None,
        )
        similarity = next((r.similarity for s in group for r in s.runs if r.similarity), None)
        if memrl is None or similarity is None:
            continue
        best = memrl.aggregate.last_success
        assert best is not None
        gains = [
            f"{s.label} {best.mean - s.aggregate.last_success.mean:+.3f}"
            for s in group
            if s is not memrl and s.aggregate.last_success
        ]
        rows.append(
            [
                memrl.config.benchmark,
                similarity.tasks,
                similarity.embedder,
                _rate(similarity.mean_pairwise),
                _spread(best),
                "; ".join(gains) or NA,
            ]
        )
    return _table(header, rows) if rows else []


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "benchmark"


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


class LineStyle(TypedDict):
    """How one setting's line is drawn (keyword arguments of matplotlib's ``plot``)."""

    marker: str
    linestyle: str
    alpha: float


def plot_metric(settings: Sequence[Setting], metric: str, name: str, title: str, out: Path) -> None:
    """One line per setting over epochs (markers and dashes differ, so equal curves stay visible).

    A setting of one run draws that run, a partial epoch's point hollow (a share of the tasks done so
    far); a setting of several seeds draws the mean over the seeds that finished each epoch, with a
    +-1 standard deviation band, and says how many seeds in its legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    try:
        any_partial = False
        for i, setting in enumerate(settings):
            style: LineStyle = {
                "marker": MARKERS[i % len(MARKERS)],
                "linestyle": LINESTYLES[i % len(LINESTYLES)],
                "alpha": 0.9,
            }
            if len(setting.runs) > 1:
                spreads = [(e.epoch, getattr(e, metric)) for e in setting.aggregate.epochs]
                if not spreads:
                    continue
                xs = [x for x, _ in spreads]
                means = [v.mean for _, v in spreads]
                stds = [v.std or 0.0 for _, v in spreads]
                (line,) = ax.plot(xs, means, label=f"{setting.label} (mean of {len(setting.runs)} seeds)", **style)
                lower = [m - d for m, d in zip(means, stds, strict=True)]
                upper = [m + d for m, d in zip(means, stds, strict=True)]
                ax.fill_between(xs, lower, upper, color=line.get_color(), alpha=0.18, linewidth=0)
                continue
            epochs = setting.runs[0].summary.epochs
            if not epochs:
                continue
            xs = [e.epoch for e in epochs]
            ys = [getattr(e, metric) for e in epochs]
            (line,) = ax.plot(xs, ys, label=setting.label, **style)
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

    With ``write_summaries`` each run folder also gets its ``summary.json`` / ``summary.csv`` and ``curve.json``.
    """
    if not run_dirs:
        raise ValueError("report needs at least one run folder")
    runs = [load_run(Path(p), min_injections=min_injections) for p in run_dirs]
    assign_labels(runs)
    if write_summaries:
        for run in runs:
            write_summary(run.path, run.summary)
            write_curve(RunDir(run.path), run.config)  # runs made before the harness kept curve.json get one
            if run.transfer is not None:
                write_summary(RunDir(run.path).transfer, run.transfer)
    out_dir.mkdir(parents=True, exist_ok=True)

    settings = settings_of(runs)
    by_benchmark: dict[str, list[Setting]] = defaultdict(list)
    for setting in settings:
        by_benchmark[setting.config.benchmark].append(setting)

    lines = ["# memrl-harness report", ""]
    lines += ["Success rates are per epoch; CSR(t) = tasks solved at least once in epochs 1..t / tasks."]
    lines += ["Forgetting = tasks solved in epoch t-1 and failed in t, over all tasks, averaged over t."]
    lines += ["A partial (unfinished) last epoch is left out of last-epoch success, best epoch and forgetting.", ""]
    lines += ["## Runs", "", *run_table(runs), ""]
    lines += ["## Per epoch", "", *epoch_table(runs), ""]
    lines += ["## Across seeds", ""]
    lines += ["Runs that differ only in their seed, as mean ± sample standard deviation (n = seeds behind it)."]
    lines += ["Held-out success: the transfer's evaluation, memory frozen (read-only server), one pass.", ""]
    lines += [*setting_table(settings), "", *setting_epoch_table(settings), ""]
    similarity = similarity_table(settings)
    if similarity:
        lines += ["## Intra-dataset similarity and MemRL's gain", ""]
        lines += ["Mean pairwise cosine of the tasks' queries with the run's embedder, next to MemRL's last-epoch"]
        lines += ["success minus each other setting's on the same tasks (the paper relates the two).", ""]
        lines += [*similarity, ""]
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
