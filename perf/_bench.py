"""Helpers shared by the benchmark scripts (not a test module): timing, tables, realistic memories.

A memory's payload here is exactly the one ``MemoryService._add`` writes (same keys,
same types), so that the stores are measured on what the service really stores.
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memrl_harness.install import shared_data_root
from memrl_mcp.memory import records
from memrl_mcp.models import MemoryView

REPO = Path(__file__).resolve().parent.parent
DIM = 384
NAMESPACES = ("alfworld", "llb-os", "llb-db", "bigcodebench")
GOAL = re.compile(r"Your task is to: ([^\"\n]+)")

_SENTENCES = (
    "open the drawer find the key then check the cabinet and put it on the shelf; run the query with a join "
    "on users and orders, group by region; list files larger than 10MB under /var/log and count them; "
    "write a function that parses the CSV, validates columns, returns a DataFrame; heat the mug in the "
    "microwave before placing it in the coffee machine; avoid deleting rows without a WHERE clause"
)
_WORDS = _SENTENCES.split()


# ---------------------------------------------------------------- statistics and printing


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def p50(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timed_ms(fn: Callable[[], Any], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, sep, *body])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"
    return str(value)


def machine() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} cores, loadavg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


# ---------------------------------------------------------------- data


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def clustered_vectors(
    n: int, rng: np.random.Generator, clusters: int, spread: float = 1.2
) -> tuple[np.ndarray, np.ndarray]:
    """(vectors, centres): unit vectors around random centres; same-cluster cosine ~0.4, unrelated ~0 +- 0.05."""
    centres = unit(rng.standard_normal((clusters, DIM)))
    which = rng.integers(0, clusters, n)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * (spread / np.sqrt(DIM))
    return unit(centres[which] + noise), centres


def synthetic_text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(_WORDS))
    return " ".join(words)[:chars]


def memory_payload(
    rng: random.Random, namespace: str, task: str, now: float, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The payload the service stores for a memory (``records.memory_payload``: its fields and the bookkeeping of
    optimistic writes), aged by a random history."""
    outcome = "success" if rng.random() < 0.7 else "failure"
    visits = rng.randint(0, 20)
    created = now - rng.uniform(0, 30 * 86400)
    memory = MemoryView(
        id=str(uuid.UUID(int=0)),  # not stored: the point's id is the caller's
        namespace=namespace,
        task=task,
        experience=synthetic_text(rng, rng.randint(250, 350)),
        outcome=outcome,
        q=round(rng.uniform(-1.0, 1.0), 4) if visits else 0.0,
        visits=visits,
        last_reward=rng.choice([1.0, 0.0, -1.0]) if visits else None,
        merges=rng.choice([0, 0, 0, 1, 2]),
        created_at=created,
        updated_at=created + rng.uniform(0, 86400),
        metadata=metadata or {},
    )
    return records.memory_payload(memory)


def shared_data_dir() -> Path:
    """The benchmark data, where the harness finds it (memrl_harness.install)."""
    return shared_data_root()


def real_task_texts(root: Path, bcb_chars: int = 300) -> dict[str, list[str]]:
    """Distinct task texts per benchmark from the shared benchmark data (empty dict if absent)."""
    texts: dict[str, list[str]] = {}
    try:
        goals = []
        for game in sorted(root.glob("alfworld/valid_*/*/*/game.tw-pddl")):
            match = GOAL.search(json.loads(game.read_text())["grammar"])
            if match:
                goals.append(match.group(1).strip())
        texts["alfworld"] = goals
        for name, key in (("os_interaction_train", "llb-os"), ("db_train", "llb-db")):
            rows = json.loads((root / "llb" / f"{name}.json").read_text())
            texts[key] = [row["instruction"].strip() for row in rows.values()]
        with (root / "bigcodebench" / "bigcodebench_v0.1.4.jsonl").open() as lines:
            texts["bigcodebench"] = [json.loads(line)["instruct_prompt"][:bcb_chars].strip() for line in lines]
    except (OSError, KeyError, ValueError):
        return {}
    return {name: list(dict.fromkeys(t for t in group if t)) for name, group in texts.items() if group}


def brute_force(
    matrix: np.ndarray, allowed: np.ndarray, query: np.ndarray, k: int, threshold: float
) -> list[tuple[int, float]]:
    """Baseline: exact cosine top-k over unit rows, restricted to ``allowed`` rows, score >= threshold."""
    scores = matrix @ query
    scores[~allowed] = -np.inf
    k = min(k, scores.size)
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top])]
    return [(int(i), float(scores[i])) for i in top if scores[i] >= threshold]
