"""``memrl-mcp calibrate``: measure the similarity constants of the configured embedder on the user's own tasks.

Every embedder has its own similarity scale, and the constants of retrieval depend on it (docs/algorithm.md,
Phase A and B; :class:`memrl_mcp.embeddings.SimilarityProfile`). This measures them from the task
texts an agent actually sends, by the method that fixed the shipped MiniLM constants
(``perf/embedders.py``), and writes them as YAML settings:

- ``sim_mean``, ``sim_std``: mean and standard deviation of the cosine similarity over all pairs of
  distinct task texts (the corpus statistics that z(sim) uses).
- ``delta``: the largest multiple of 0.05 that still lets at least 95% of the tasks recall their
  nearest other task (the shipped MiniLM delta meets it in every benchmark: docs/embeddings.md).
- ``merge_threshold``: the smallest multiple of 0.01 above the highest similarity of two different
  tasks, so that no two different tasks of the sample merge (1.0: only identical texts do). Texts equal up to case,
  spacing and trailing punctuation count as one task here: those should merge.

Only one corpus is seen, so unlike the benchmark script this cannot check how often unrelated tasks
pass ``delta``; mixing task kinds in the file gives the closest answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from memrl_mcp.embeddings import Embedder, load_model
from memrl_mcp.errors import MemrlError
from memrl_mcp.settings import Settings
from memrl_mcp.storage import open_store

MIN_TASKS = 20
NEAREST_KEPT = 0.95
DELTA_STEP = 0.05
MERGE_STEP = 0.01


class CalibrationError(MemrlError, ValueError):
    """Calibration was refused: unreadable or too little input; the message names the file, line or namespace."""


@dataclass(frozen=True)
class Calibration:
    """The measured constants, and the figures behind them (written as comments)."""

    embedder: str
    source: str
    tasks: int
    sim_mean: float
    sim_std: float
    delta: float
    nearest_kept: float
    merge_threshold: float
    closest_different: float

    def to_yaml(self) -> str:
        settings = {
            "delta": self.delta,
            "sim_mean": self.sim_mean,
            "sim_std": self.sim_std,
            "merge_threshold": self.merge_threshold,
        }
        return (
            f"# memrl-mcp calibrate: embedder {self.embedder}, {self.tasks} distinct tasks from {self.source}\n"
            f"# delta keeps the nearest other task of {self.nearest_kept:.0%} of the tasks;"
            f" the closest two different tasks: {self.closest_different:.3f}\n"
            + yaml.safe_dump({"similarity": settings}, sort_keys=False)
        )


def same_task_key(text: str) -> str:
    """Texts with equal keys are one task written differently (case, spacing, trailing punctuation)."""
    return " ".join(text.casefold().split()).rstrip(".!?;: ")


def require_enough(texts: Sequence[str], source: str) -> None:
    if len(texts) < MIN_TASKS:
        raise CalibrationError(f"{source}: {len(texts)} distinct task texts; calibration needs at least {MIN_TASKS}")


def measure(vectors: np.ndarray, texts: Sequence[str], embedder: str, source: str) -> Calibration:
    """The constants for unit ``vectors`` of distinct ``texts`` (see the module docstring for the rules)."""
    require_enough(texts, source)
    sims = vectors @ vectors.T
    off_diagonal = ~np.eye(len(texts), dtype=bool)
    pairs = sims[off_diagonal]
    nearest = np.where(off_diagonal, sims, -np.inf).max(axis=1)
    # The largest grid value at or below the 5th percentile of nearest-neighbour similarity.
    delta = math.floor(np.percentile(nearest, 100 * (1 - NEAREST_KEPT)) / DELTA_STEP + 1e-9) * DELTA_STEP
    task_ids = np.unique([same_task_key(t) for t in texts], return_inverse=True)[1]
    different = task_ids[:, None] != task_ids[None, :]
    if not different.any():
        raise CalibrationError(f"{source}: every text is the same task up to case, spacing and punctuation")
    closest = float(sims[different].max())
    merge = min(1.0, (math.floor(closest / MERGE_STEP + 1e-9) + 1) * MERGE_STEP)
    return Calibration(
        embedder=embedder,
        source=source,
        tasks=len(texts),
        sim_mean=round(float(pairs.mean()), 3),
        sim_std=round(float(pairs.std()), 3),
        delta=round(delta, 2),
        nearest_kept=float(np.mean(nearest >= delta - 1e-9)),
        merge_threshold=round(merge, 2),
        closest_different=closest,
    )


def read_tasks(path: Path, max_chars: int) -> list[str]:
    """Task texts of a file: one per line, or JSON Lines of objects with a ``task`` string (an export works)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise CalibrationError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except OSError as error:
        raise CalibrationError(f"{path}: {error.strerror}") from None
    numbered = [(number, line.strip()) for number, line in enumerate(lines, 1) if line.strip()]
    json_lines = bool(numbered) and numbered[0][1].startswith("{")
    tasks = []
    for number, line in numbered:
        task = _json_task(path, number, line) if json_lines else line
        if len(task) > max_chars:
            raise CalibrationError(f"{path}, line {number}: task has {len(task)} characters; at most {max_chars}")
        tasks.append(task)
    return tasks


def _json_task(path: Path, number: int, line: str) -> str:
    try:
        record = json.loads(line)
    except ValueError as error:
        raise CalibrationError(f"{path}, line {number}: not JSON ({error}); give JSON Lines or plain lines") from None
    task = record.get("task") if isinstance(record, dict) else None
    if not isinstance(task, str) or not task.strip():
        raise CalibrationError(f"{path}, line {number}: task: expected a non-empty string")
    return task.strip()


def namespace_tasks(settings: Settings, namespace: str, dim: int) -> list[str]:
    """Task texts of the memories of ``namespace`` in the configured store."""
    storage = settings.storage
    if not storage.qdrant_url and not storage.data_dir.is_dir():
        raise CalibrationError(f"no memory store in {storage.data_dir}")
    store = open_store(storage, dim, read_only=True)  # a reader: changes nothing
    try:
        return [
            payload["task"]
            for _, payload in store.scroll("memories", fields=["namespace", "task"])
            if payload.get("namespace") == namespace
        ]
    finally:
        store.close()


def calibrate(settings: Settings, tasks_file: Path | None, namespace: str | None) -> Calibration:
    """Measure the configured embedder on ``tasks_file`` or on the memories of ``namespace``.

    A file is read before the model is loaded, so that bad input is refused at once."""
    if tasks_file is not None:
        texts, source = read_tasks(tasks_file, settings.limits.max_task_chars), str(tasks_file)
        model: Embedder = load_model(settings.embeddings, settings.similarity)
    else:
        model = load_model(
            settings.embeddings, settings.similarity
        )  # the store checks that its vectors have this model's size
        texts, source = (
            namespace_tasks(settings, namespace or settings.namespaces.namespace, model.dim),
            f"namespace {namespace!r}",
        )
    distinct = list(dict.fromkeys(texts))
    require_enough(distinct, source)  # before the embedding work
    return measure(model.embed(distinct), distinct, model.name, source)
