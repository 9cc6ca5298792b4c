"""Fairness of the local memory server: one session's recall latency, alone and while another session floods the
server with writes.

A real local server (``memrl-mcp local run``, started as a session starts it) on a store and a runtime folder of the
run's own, seeded with ``--seed`` memories. The **recalling session** (:class:`~memrl_mcp.local.client.LocalClient`,
as a hook makes its calls) recalls ``--recalls`` times, one call after another, from a set of ten tasks (their
embeddings cached after the first round: the recall an agent makes of a task it saw, the server's shortest call);
each call is timed from its request to its answer. The **flooding session**, a connection of its own, keeps
``--in-flight`` ``store_experience`` calls of new tasks in flight for as long as the recalls run (each answered call
is replaced at once by another): what a runaway agent or a hostile script of the user's can send.

Each of ``--runs`` rounds measures the recalls alone, then the same under the flood (alternating which goes first);
printed: each run's median, and the medians and p90 over every recall of the runs of each kind, with the writes the
flood had answered per second.

    /work/main/.venv/bin/python perf/local_fairness.py               # 5 runs of 200 recalls, 64 writes in flight
    /work/main/.venv/bin/python perf/local_fairness.py --set MEMRL_LOCAL_SESSION_THREADS=1   # the server's settings
    PYTHONPATH=/path/to/another/checkout python perf/local_fairness.py   # that checkout's server (the code it runs)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

from memrl_mcp.local.attach import attach, target_of
from memrl_mcp.local.client import LocalClient

TASKS = [f"deploy the web service number {i} to the staging cluster and check its health" for i in range(10)]


class Flood:
    """A session that keeps ``in_flight`` writes in flight until stopped, on a greeted connection of its own."""

    def __init__(self, connection: socket.socket, in_flight: int) -> None:
        self._connection, self._in_flight = connection, in_flight
        self._reader = connection.makefile("rb")
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self.answered = 0
        self._send({"id": 0, "method": "initialize", "params": handshake()})
        self._reader.readline()
        self._send({"method": "notifications/initialized"})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _send(self, message: dict[str, Any]) -> None:
        self._connection.sendall(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    def _write(self) -> None:
        number = next(self._ids)
        arguments = {"task": f"flood task {number} {os.getpid()}: rotate key {number * 7919}", "experience": "x" * 200}
        params = {"name": "store_experience", "arguments": arguments}
        self._send({"id": number, "method": "tools/call", "params": params})

    def _run(self) -> None:
        for _ in range(self._in_flight):
            self._write()
        open_calls = self._in_flight
        while open_calls:
            line = self._reader.readline()
            if not line:
                return
            if "id" not in json.loads(line):
                continue
            self.answered += 1
            open_calls -= 1
            if not self._stop.is_set():
                self._write()
                open_calls += 1

    def __enter__(self) -> Flood:
        self._thread.start()
        time.sleep(0.5)  # the flood in full swing before the first recall
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=600)
        self._reader.close()
        self._connection.close()


def handshake() -> dict[str, Any]:
    return {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}


def recalls(client: LocalClient, count: int) -> list[float]:
    """Milliseconds of each of ``count`` recalls, one after another."""
    timings = []
    for index in range(count):
        started = time.perf_counter()
        client.call_tool("recall_experience", {"task": TASKS[index % len(TASKS)]})
        timings.append(1000 * (time.perf_counter() - started))
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds, each alone and under the flood")
    parser.add_argument("--recalls", type=int, default=200, help="recalls per run")
    parser.add_argument("--in-flight", type=int, default=64, help="writes the flood keeps in flight")
    parser.add_argument("--seed", type=int, default=200, help="memories stored before the runs")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE: a variable of the server's settings")
    args = parser.parse_args()
    print(f"local fairness: {B.machine()}; {' '.join(args.set) or 'the default settings'}")
    with tempfile.TemporaryDirectory(prefix="mrl-fair-", dir="/tmp") as tmp:
        root = Path(tmp)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
        environ |= {"MEMRL_DATA_DIR": str(root / "data"), "MEMRL_RUNTIME_DIR": str(root / "run")}
        environ |= dict(setting.split("=", 1) for setting in args.set)
        target = target_of(environ=environ, cwd=root)
        assert target is not None
        with LocalClient(attach(target).connection) as client:
            for index in range(args.seed):
                task = f"seeded task {index}: {TASKS[index % len(TASKS)]} with variant {index * 31}"
                client.call_tool("store_experience", {"task": task, "experience": f"lesson {index}"})
            recalls(client, 2 * len(TASKS))  # every task's embedding cached
            alone: list[list[float]] = []
            flooded: list[list[float]] = []
            rates = []
            for run in range(args.runs):
                for kind in ("alone", "flood") if run % 2 == 0 else ("flood", "alone"):
                    if kind == "alone":
                        alone.append(recalls(client, args.recalls))
                        continue
                    started = time.perf_counter()
                    with Flood(attach(target).connection, args.in_flight) as flood:
                        flooded.append(recalls(client, args.recalls))
                    rates.append(flood.answered / (time.perf_counter() - started))
                print(f"run {run + 1}: recall median alone {B.p50(alone[-1]):.2f} ms, under the flood "
                      f"{B.p50(flooded[-1]):.2f} ms ({rates[-1]:.0f} writes/s answered)")  # fmt: skip
        every_alone = [ms for run in alone for ms in run]
        every_flooded = [ms for run in flooded for ms in run]
        print(f"\nrecall of a cached task, {args.runs} runs of {args.recalls} (one session; the other keeping "
              f"{args.in_flight} writes in flight):")  # fmt: skip
        rows = [
            ("alone", B.p50(every_alone), B.pct(every_alone, 90), "-"),
            ("under the flood", B.p50(every_flooded), B.pct(every_flooded, 90), f"{B.p50(rates):.0f}"),
        ]
        print(B.table(("recalling session", "median ms", "p90 ms", "flood writes/s (median)"), rows))
        print(f"flood / alone, median: {B.p50(every_flooded) / B.p50(every_alone):.1f}x")
        attach(target, "stop", start=False).connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
