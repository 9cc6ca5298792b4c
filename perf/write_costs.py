"""What each guarantee costs a Q update's write (a benchmark; the figures in the comments where the code pays them).

The service in process on the default embedded store (shipped embedder), ``--tasks`` memories recalled and reported
until each has been updated ``--age`` times (its list of applied operations full; its Q history's older events
copied to the history table, the last few in its tail); then the write a report makes three times, ``set_payload``
of a Q update (the ledger's fold: q, visits, last reward, time, the history's tail and chunk count, version,
applied), timed layer by layer in alternating rounds, median microseconds of CPU per write over ``--rounds`` rounds:

- **plain**: qdrant-edge's ``set_payload`` under the store's lock, with the memories' tally (the engine's floor here);
- **conditional**: ``set_payload_if`` on the version read (exactly once: the read of the fields under the lock and
  the check of the condition);
- **metered**: the same through the quota layer (each namespace's bytes counted write by write);
- **copy of a full tail**: the upsert of one chunk of 8 events into the history table through the quota layer, which
  one Q update in 8 pays before its write (:mod:`memrl_mcp.memory.history`);
- and, alone, what the write pays for the other guarantees: the float round-trip (``kept`` of the update) and the
  free-space guard (``statvfs``).

    .venv/bin/python perf/write_costs.py
    .venv/bin/python perf/write_costs.py --tasks 3 --age 3 --rounds 2 --writes 20     # a tiny run (tests)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.history import HISTORY_TAIL, chunk_id, joined
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import PLACEHOLDER, Point, Store
from memrl_mcp.storage.files import free_bytes
from memrl_mcp.storage.numbers import kept
from memrl_mcp.storage.quota import MeteredStore


def cpu_us(work: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        work()
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--age", type=int, default=64, help="updates of each memory first (history 50, applied 64)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--writes", type=int, default=500, help="writes per layer and round")
    args = parser.parse_args()
    texts = [f"heat the mug number {i} in the microwave and put it on the table" for i in range(args.tasks)]
    with tempfile.TemporaryDirectory() as folder:
        service = MemoryService.open(load_settings(data_dir=Path(folder), embedded_engine="edge"), MiniLMEmbedder())
        ids = [
            service.store_experience(NewExperience(text, "take it, heat it"), access=EVERYTHING).id for text in texts
        ]
        for i in range(args.age * args.tasks):
            recall = service.recall(RecallQuery(texts[i % args.tasks]), access=EVERYTHING)
            service.report(OutcomeReport(recall.recall_id, 1.0 if i % 3 else -1.0), access=EVERYTHING)
        metered = service._store  # the quota layer over the embedded store
        assert isinstance(metered, MeteredStore), metered
        edge = metered._inner
        memory_id, memory = max(edge.get("memories", ids).items(), key=lambda item: item[1]["visits"])
        fields = ("q", "visits", "last_reward", "updated_at", "history", "history_chunks", "applied")
        update = {key: memory.get(key, 0) for key in fields}
        version, copies = int(memory["version"]), 0
        event = '{"at": 1.7e9, "event": "reward", "reward": 1.0, "q_before": 0.1, "q_after": 0.37, "recall_id": null}'
        chunk = {"namespace": memory["namespace"], "memory": memory_id, "events": joined([event] * HISTORY_TAIL)}

        def copy() -> None:
            nonlocal copies
            point = Point(chunk_id(memory_id, copies), PLACEHOLDER, {**chunk, "number": copies})
            metered.upsert("history", [point])
            copies += 1

        def write(store: Store, conditional: bool) -> Callable[[], object]:
            def once() -> None:
                nonlocal version
                fields = {**update, "version": version + 1}
                if conditional:
                    assert store.set_payload_if("memories", memory_id, fields, {"version": version})
                else:
                    store.set_payload("memories", memory_id, fields)
                version += 1

            return once

        layers = {"plain": write(edge, False), "conditional": write(edge, True), "metered": write(metered, True)}
        layers["copy"] = copy
        alone = {
            "kept(update)": lambda: kept({**update, "version": version}),
            "statvfs": lambda: free_bytes(Path(folder)),
        }
        spent: dict[str, list[float]] = {name: [] for name in [*layers, *alone]}
        for _ in range(args.rounds):
            for name, work in {**layers, **alone}.items():
                spent[name].append(cpu_us(work, args.writes))
        service.close()
    median = {name: statistics.median(values) for name, values in spent.items()}
    history, applied = len(update["history"]), len(update["applied"])
    print(f"a Q update's write (history's tail {history} characters, applied {applied}), median us of CPU over "
          f"{args.rounds} rounds of {args.writes}:")  # fmt: skip
    plain, conditional, metered_us = median["plain"], median["conditional"], median["metered"]
    print(f"  plain set_payload {plain:.0f} us (the free-space guard and the memories' tally included)")
    print(f"  conditional (exactly once) {conditional:.0f} us: {conditional - plain:+.0f}")
    print(f"  metered (quota) {metered_us:.0f} us: {metered_us - conditional:+.0f}")
    print(f"  copy of a full tail to the history table (one update in {HISTORY_TAIL}) {median['copy']:.0f} us")
    print(f"  float round-trip (kept) {median['kept(update)']:.1f} us")
    print(f"  free-space guard (statvfs) {median['statvfs']:.1f} us")


if __name__ == "__main__":
    main()
