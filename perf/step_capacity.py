"""What a new step costs the step memory at its record capacity: Rememberer's rule decided the old way
(read every record of the namespace, build the similarity matrix of all pairs) against the way the service decides
it now (the new record's nearest neighbour, and the closest stored pair through each record's indexed ``nearest``:
``StepMemory.room``), on the same store, in one process.

For each capacity, a namespace of an embedded store (qdrant-edge) is filled by reports (the shipped embedder, room
descriptions, each its own record); then for each of ``--steps`` new observations both decisions are timed
``--runs`` times on the same state (medians), checked to pick the same record, and the step is reported (the
service evicting what they picked) before the next one. The whole report of that one step is timed too.

    .venv/bin/python perf/step_capacity.py
    .venv/bin/python perf/step_capacity.py --capacities 20 --steps 3 --runs 2     # a tiny run (tests)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memrl_mcp.embeddings import MiniLMEmbedder, embed_scoped, embed_tasks
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.memory.steps import embedded_text
from memrl_mcp.requests import TrajectoryReport
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Store, open_store
from memrl_mcp.validation import TrajectoryStep

TASK = "put a clean mug in the coffee machine"
PLACES = ["countertop", "cabinet", "drawer", "fridge", "sinkbasin", "microwave", "shelf", "diningtable", "desk"]
THINGS = ["mug", "cup", "knife", "apple", "bread", "lettuce", "tomato", "egg", "pan", "pot", "plate", "bowl", "key"]


def room_description(rng: random.Random) -> str:
    place = rng.choice(PLACES)
    things = ", ".join(f"a {rng.choice(THINGS)} {rng.randrange(1, 9)}" for _ in range(rng.randrange(2, 7)))
    return f"You arrive at {place} {rng.randrange(1, 9)}. On the {place} {rng.randrange(1, 9)}, you see {things}."


def all_pairs(store: Store, namespace: str, vector: np.ndarray, weight: float) -> str | None:
    """The decision as the service made it before: every record read, the matrix of all pairs. The id that goes
    (None: the new record is dropped); a tie of samples goes to the smaller id, as in algorithm.record_to_evict."""
    rows = list(store.vectors("steps", {"namespace": namespace}, ("actions",)))
    matrix = np.stack([row[1] for row in rows]).astype(np.float64)
    dim = matrix.shape[1] // 2
    tasks, observations = matrix[:, :dim], matrix[:, dim:]
    pairs = (1.0 - weight) * tasks @ tasks.T + weight * observations @ observations.T
    np.fill_diagonal(pairs, -np.inf)
    i, j = np.unravel_index(int(np.argmax(pairs)), pairs.shape)
    new = (1.0 - weight) * tasks @ vector[:dim] + weight * observations @ vector[dim:]
    if new.max() >= pairs[i, j]:
        return None
    samples = {row[0]: sum(int(a["visits"]) for a in row[2]["actions"]) for row in rows}
    first, second = sorted((rows[i][0], rows[j][0]))
    return first if samples[first] >= samples[second] else second


def measure(embedder: MiniLMEmbedder, capacity: int, steps: int, runs: int) -> dict[str, float]:
    rng = random.Random(capacity)
    distinct: dict[str, None] = {}
    while len(distinct) < capacity + steps:
        distinct[room_description(rng)] = None
    texts = list(distinct)
    with tempfile.TemporaryDirectory() as folder:
        settings = load_settings(data_dir=folder, step_max_records=capacity)
        store = open_store(settings.storage, embedder.dim)
        service = MemoryService.open(settings, embedder, store)
        fill = [TrajectoryStep(observation=text, action="look", reward=0.0) for text in texts[:capacity]]
        for first in range(0, capacity, 100):
            service.report_trajectory(
                TrajectoryReport(TASK, fill[first : first + 100], f"fill-{first}"), access=EVERYTHING
            )
        task = embed_tasks(embedder, [TASK], "default")[0]
        old_ms, new_ms, report_ms, agreed = [], [], [], 0
        for n, text in enumerate(texts[capacity:]):
            vector = np.concatenate([task, embed_scoped(embedder, [embedded_text(text, 512)], "default")[0]])
            new_runs = []
            for _ in range(runs):  # first: numpy's threads still spin for a while after the matrix products
                start = time.perf_counter()
                room = service.steps.room("default", vector)
                new_runs.append((time.perf_counter() - start) * 1000)
            old_runs = []
            for _ in range(runs):
                start = time.perf_counter()
                old = all_pairs(store, "default", vector, settings.steps.step_observation_weight)
                old_runs.append((time.perf_counter() - start) * 1000)
            agreed += old == (room.evict if room.stored else None)
            old_ms.append(statistics.median(old_runs))
            new_ms.append(statistics.median(new_runs))
            start = time.perf_counter()
            step = [TrajectoryStep(observation=text, action="look", reward=0.0)]
            service.report_trajectory(TrajectoryReport(TASK, step, f"new-{n}"), access=EVERYTHING)
            report_ms.append((time.perf_counter() - start) * 1000)
        service.close()
    return {
        "old": statistics.median(old_ms),
        "new": statistics.median(new_ms),
        "report": statistics.median(report_ms),
        "agreed": agreed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacities", type=int, nargs="+", default=[500, 2000], help="step_max_records")
    parser.add_argument("--steps", type=int, default=10, help="new observations per capacity")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each decision per observation")
    args = parser.parse_args()
    embedder = MiniLMEmbedder()
    print("per new record at the capacity, medians (ms): the decision the old way, the decision now, the whole")
    print("report of that one step now (two embeddings included)")
    print(f"{'capacity':>9} {'all pairs':>10} {'now':>8} {'speed-up':>9} {'report now':>11} {'same pick':>10}")
    for capacity in args.capacities:
        m = measure(embedder, capacity, args.steps, args.runs)
        print(
            f"{capacity:>9} {m['old']:>10.2f} {m['new']:>8.2f} {m['old'] / m['new']:>8.0f}x {m['report']:>11.1f} "
            f"{int(m['agreed']):>6}/{args.steps}"
        )
        print(f"{'':>9} 200 new steps in one report at this capacity: {200 * m['old'] / 1000:.1f} s of old decisions")


if __name__ == "__main__":
    main()
