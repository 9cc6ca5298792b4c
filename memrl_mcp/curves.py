"""Learning curves: the file a run folder holds, written by memrl-harness, drawn by the ``/ui`` inspector.

A harness run (one benchmark, one memory mode, one seed) keeps ``curve.json`` in its folder (:class:`RunCurve`): the
success rate and the cumulative success rate (CSR) of each epoch, rewritten after every episode so that a run in
progress shows its unfinished epoch as partial. The memory server owns this format (the harness imports it), so the
server reads curves without the harness installed. :func:`curves` groups the runs of one setting (same benchmark
and ``setting``, other seeds) and draws their mean with its standard deviation over the seeds that finished the
epoch, as the harness's report does.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from memrl_mcp.storage.files import write_atomically

CURVE_FILE = "curve.json"


class CurvePoint(BaseModel):
    epoch: int
    value: float
    std: float | None = Field(None, description="Over seeds, when the curve is a mean of several.")
    partial: bool = Field(False, description="An unfinished epoch: the share of the tasks done so far.")


class RunCurve(BaseModel):
    """One run's learning curve, as its ``curve.json`` holds it."""

    benchmark: str
    setting: str = Field(
        description="What the run's configuration is apart from its seed: runs of equal setting "
        "are seeds of one experiment."
    )
    label: str = Field(description="The setting in a few words (its memory mode), as a legend shows it.")
    seed: int
    success_rate: list[CurvePoint]
    csr: list[CurvePoint]

    def write(self, folder: Path) -> None:
        """Replace ``folder/curve.json`` whole (a reader never sees half a file)."""
        text = self.model_dump_json().encode()
        write_atomically(folder / CURVE_FILE, lambda stream: stream.write(text))

    @classmethod
    def read(cls, folder: Path) -> RunCurve:
        return cls.model_validate_json((folder / CURVE_FILE).read_text())


class Curve(BaseModel):
    """One setting (runs that differ only in their seed) of one benchmark."""

    label: str
    seeds: int
    success_rate: list[CurvePoint]
    csr: list[CurvePoint]


class BenchmarkCurves(BaseModel):
    benchmark: str
    curves: list[Curve]


class Curves(BaseModel):
    available: list[str] = Field(description="Every configured run folder (folder names).")
    runs: list[str] = Field(description="The run folders drawn.")
    benchmarks: list[BenchmarkCurves]
    problems: list[str] = Field(description="Run folders that could not be read, and why.")


def run_folders(roots: list[Path]) -> list[Path]:
    """The run folders under the configured paths: a folder with a ``curve.json``, or the ones directly in it."""
    folders: list[Path] = []
    for root in roots:
        if (root / CURVE_FILE).is_file():
            folders.append(root)
        elif root.is_dir():
            folders += sorted(child for child in root.iterdir() if (child / CURVE_FILE).is_file())
    return folders


def curves(folders: list[Path], wanted: set[str]) -> Curves:
    """Success per epoch and CSR per setting of the ``wanted`` folders (all when empty), grouped by benchmark; a
    setting of several seeds is their mean with its standard deviation, over the seeds that finished the epoch."""
    runs: list[tuple[str, RunCurve]] = []
    problems = []
    for folder in folders:
        if wanted and folder.name not in wanted:
            continue
        try:
            runs.append((folder.name, RunCurve.read(folder)))
        except (OSError, ValidationError) as error:
            problems.append(f"{folder.name}: {type(error).__name__}: {str(error).splitlines()[0]}")
    settings: dict[tuple[str, str], list[RunCurve]] = defaultdict(list)
    for _, run in runs:
        settings[(run.benchmark, run.setting)].append(run)
    by_benchmark: dict[str, list[Curve]] = defaultdict(list)
    for group in settings.values():
        first = group[0]
        if len(group) == 1:
            curve = Curve(label=first.label, seeds=1, success_rate=first.success_rate, csr=first.csr)
        else:
            success, csr = _mean([run.success_rate for run in group]), _mean([run.csr for run in group])
            curve = Curve(label=first.label, seeds=len(group), success_rate=success, csr=csr)
        by_benchmark[first.benchmark].append(curve)
    for group_curves in by_benchmark.values():  # one label, other options (tasks, epochs, ...): numbered
        repeated = {c.label for c in group_curves if sum(d.label == c.label for d in group_curves) > 1}
        seen: dict[str, int] = defaultdict(int)
        for curve in group_curves:
            if curve.label in repeated:
                seen[curve.label] += 1
                curve.label = f"{curve.label} #{seen[curve.label]}"
    return Curves(
        available=[folder.name for folder in folders],
        runs=[name for name, _ in runs],
        benchmarks=[BenchmarkCurves(benchmark=name, curves=group) for name, group in by_benchmark.items()],
        problems=problems,
    )


def _mean(series: list[list[CurvePoint]]) -> list[CurvePoint]:
    """Per epoch, the mean and sample standard deviation over the runs that finished it (partial points left out)."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for points in series:
        for point in points:
            if not point.partial:
                by_epoch[point.epoch].append(point.value)
    return [
        CurvePoint(
            epoch=epoch, value=statistics.fmean(values), std=statistics.stdev(values) if len(values) > 1 else None
        )
        for epoch, values in sorted(by_epoch.items())
    ]
