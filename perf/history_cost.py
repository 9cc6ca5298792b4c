"""What a memory's Q history costs a report (a benchmark; why schema version 2 stores it as JSON text).

1. qdrant-edge's Python binding converts a payload value by value when a write is built: the same update with a
   history of ``--events`` events as a list (as schema version 1 stored it) and as JSON text (version 2, encoding
   included), median microseconds per write over ``--rounds`` rounds, and their ratio.
2. The service in process (embedded store, shipped embedder, ``--tasks`` tasks recalled and reported in turn, so that
   every memory's history is full): CPU per recall + report cycle with ``q_history_size = --events`` against the
   same cycle with no history kept (``q_history_size = 0``), alternating rounds in one process, medians.

    .venv/bin/python perf/history_cost.py
    .venv/bin/python perf/history_cost.py --events 5 --rounds 2 --cycles 20     # a tiny run (tests)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.settings import load_settings

POINT = "00000000-0000-4000-8000-000000000001"


def per_call_us(work: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - start) / calls * 1e6


def conversion(events: int, rounds: int) -> None:
    import qdrant_edge as edge

    history = [
        {"at": 1.7e9 + i, "event": "reward", "reward": 1.0, "q_before": 0.1 * i, "q_after": 0.1 * i + 0.03,
         "recall_id": f"{i:036d}"}
        for i in range(events)
    ]  # fmt: skip
    update = {"q": 0.42, "visits": events, "updated_at": 1.7e9, "last_reward": 1.0, "version": events}
    as_list = [
        per_call_us(lambda: edge.UpdateOperation.set_payload([POINT], {**update, "history": history}), 200)
        for _ in range(rounds)
    ]
    as_text = [
        per_call_us(lambda: edge.UpdateOperation.set_payload([POINT], {**update, "history": json.dumps(history)}), 200)
        for _ in range(rounds)
    ]
    listed, texted = statistics.median(as_list), statistics.median(as_text)
    print(
        f"a Q update's write, history of {events} events: as a list {listed:.0f} us, as JSON text {texted:.0f} us "
        f"(encoding included): {listed / texted:.1f}x"
    )


def cycles(events: int, rounds: int, count: int, tasks: int) -> None:
    embedder = MiniLMEmbedder()
    texts = [f"heat the mug number {i} in the microwave and put it on the table" for i in range(tasks)]
    services = {}
    with tempfile.TemporaryDirectory() as folder:
        for kept in (events, 0):
            settings = load_settings(data_dir=Path(folder) / str(kept), embedded_engine="edge", q_history_size=kept)
            service = MemoryService.open(settings, embedder)
            for text in texts:
                service.store_experience(NewExperience(text, "take it, heat it, put it down"), access=EVERYTHING)
            services[kept] = service

        def run(service: MemoryService, n: int) -> float:
            start = time.process_time()
            for i in range(n):
                recall = service.recall(RecallQuery(texts[i % tasks]), access=EVERYTHING)
                service.report(OutcomeReport(recall.recall_id, 1.0 if i % 3 else 0.0), access=EVERYTHING)
            return (time.process_time() - start) / n * 1000

        for service in services.values():
            run(service, events * tasks)  # every memory updated at least `events` times: its history is full
        with_history, without = [], []
        for _ in range(rounds):
            with_history.append(run(services[events], count))
            without.append(run(services[0], count))
        for service in services.values():
            service.close()
    kept_ms, none_ms = statistics.median(with_history), statistics.median(without)
    print(
        f"recall + report in process, CPU per cycle: {kept_ms:.2f} ms with full histories of {events} events, "
        f"{none_ms:.2f} ms keeping none: {kept_ms / none_ms:.2f}x ({rounds} alternating rounds of {count} cycles)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50, help="history length (the default q_history_size)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=150, help="recall + report cycles per round")
    parser.add_argument("--tasks", type=int, default=20)
    args = parser.parse_args()
    conversion(args.events, args.rounds)
    cycles(args.events, args.rounds, args.cycles, args.tasks)


if __name__ == "__main__":
    main()
