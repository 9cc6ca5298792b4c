"""Server CPU per recall -> report cycle over MCP stdio: this version against a baseline commit, in one run.

Both servers run as stdio processes (``python -m memrl_mcp.cli``), the baseline from its own tree (``git archive``
of ``--baseline``, default a1ec11d, into a temporary folder, run with ``PYTHONPATH`` there: it reads flat settings
and ``MEMRL_*`` variables and offers every tool). One MCP client drives both, in blocks that alternate between them
(the first one of each round alternates too), and the CPU time a block cost a server is read from
``/proc/<pid>/stat`` (utime + stime, every thread of the process) before and after it. Nothing else runs in either
server meanwhile, so the difference is what the block's tool calls cost it: the SDK's path, the service, the store.

Two kinds of block, on ``--tasks`` real task texts (ALFWorld goals of the shared data; synthetic texts without it),
one cycle = ``recall_experience(task)`` then ``report_outcome(recall_id, reward)``, rewards random in [-1, 1]:

- **fresh**: memories just stored: each pass stores the tasks in a new namespace (not measured), then recalls and
  reports each task once (measured), so a recalled memory holds at most a few Q updates;
- **full**: memories whose Q history and list of applied operations are full: the tasks' namespace was aged in
  the setup until each of its memories had been updated ``--age`` times (the history keeps 50, the applied list
  64), then each pass recalls and reports each task once.

Printed: per version and kind, the median over ``--rounds`` rounds of the server's CPU per cycle, the ratio of this
version to the baseline (per round, then the median), and full / fresh for each version (flat: within 10%).

``--attach`` compares two ways of serving this version instead: a stdio server of its own (``--no-attach``, the
baseline) against a session attached to the local memory server (the relay the client spawned, and the local
server behind it, on a runtime folder of the run's own). The CPU of the attached side is the relay's plus the local
server's; the client's wall time per cycle is printed for both.

    /work/main/.venv/bin/python perf/cycle_cost.py                     # 5 rounds of 4 passes over 20 tasks
    /work/main/.venv/bin/python perf/cycle_cost.py --rounds 2 --passes 1 --tasks 5 --age 3       # a tiny run
    /work/main/.venv/bin/python perf/cycle_cost.py --attach            # attached against a server of its own
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

BASELINE = "a1ec11d"
KINDS = ("fresh", "full")


def baseline_tree(commit: str, folder: Path) -> Path:
    """The baseline's package (``memrl_mcp`` at ``commit``, from this repository's history) under ``folder``."""
    archive = subprocess.run(
        ["git", "-C", str(B.REPO), "archive", commit, "memrl_mcp"], capture_output=True, check=True
    ).stdout
    folder.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pid(marker: str, parent: int | None = None) -> int:
    """The pid of the child of ``parent`` (default: this process) whose command line holds ``marker`` (the server's
    own data folder)."""
    parent = os.getpid() if parent is None else parent
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ppid == parent and marker in cmdline:
            return int(entry.name)
    raise RuntimeError(f"no server process found for {marker}")


def task_texts(count: int, seed: int) -> list[str]:
    """ALFWorld goals (short, many of them alike: a recall finds several memories), or synthetic texts."""
    goals = B.real_task_texts(B.shared_data_dir()).get("alfworld", [])
    rng = random.Random(seed)
    if len(goals) >= count:
        return rng.sample(goals, count)
    return [B.synthetic_text(rng, rng.randint(40, 120)) for _ in range(count)]


@dataclass
class Server:
    """One version's stdio server (its processes), its client, and the CPU and the client's wall time each kind of
    block cost, per round (s per cycle)."""

    name: str
    client: Client
    pids: list[int]
    cpu: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    wall: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    first: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    """The share of ``cpu`` that the first process took (attached: the relay), per round."""
    fresh_namespaces: int = 0

    def cpu_seconds(self) -> list[float]:
        return [cpu_seconds(pid) for pid in self.pids]

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.client.call_tool(tool, arguments)
        if result.is_error:
            raise RuntimeError(f"{self.name} {tool}: {result.content}")
        return result.structured_content or {}

    async def store(self, tasks: list[str], namespace: str) -> set[str]:
        """Store each task's memory (a near-duplicate merges into its twin); the ids of the memories."""
        ids = set()
        for task in tasks:
            arguments = {"task": task, "experience": "take it, heat it, put it down", "namespace": namespace}
            ids.add((await self.call("store_experience", arguments))["id"])
        return ids

    async def cycles(self, tasks: list[str], namespace: str, rng: random.Random) -> dict[str, int]:
        """Recall and report each task once; the visits each updated memory reached."""
        visits: dict[str, int] = {}
        for task in tasks:
            recall = await self.call("recall_experience", {"task": task, "namespace": namespace})
            reward = round(rng.uniform(-1.0, 1.0), 4)
            report = await self.call("report_outcome", {"recall_id": recall["recall_id"], "reward": reward})
            visits |= {change["id"]: change["visits"] for change in report["updated"]}
        return visits

    async def measured(self, kind: str, tasks: list[str], passes: int, seed: int) -> None:
        rng, spent, first, waited = random.Random(seed), 0.0, 0.0, 0.0
        for _ in range(passes):
            namespace = "aged"
            if kind == "fresh":
                self.fresh_namespaces += 1
                namespace = f"fresh-{self.fresh_namespaces}"
                await self.store(tasks, namespace)
            before, started = self.cpu_seconds(), time.perf_counter()
            await self.cycles(tasks, namespace, rng)
            costs = [after - then for after, then in zip(self.cpu_seconds(), before, strict=True)]
            spent, first = spent + sum(costs), first + costs[0]
            waited += time.perf_counter() - started
        self.cpu[kind].append(spent / (passes * len(tasks)))
        self.first[kind].append(first / spent if spent else 0.0)
        self.wall[kind].append(waited / (passes * len(tasks)))


@asynccontextmanager
async def server(
    stack: AsyncExitStack, name: str, code: Path, data: Path, errlog: TextIO, runtime: Path | None = None
) -> AsyncIterator[Server]:
    """``name``'s stdio server of the code at ``code``; with ``runtime``, attached to a local server there (whose
    CPU counts with the relay's), else a process of its own (``--no-attach`` where the code has the option)."""
    env = {"PYTHONPATH": str(code)}
    args = ["-m", "memrl_mcp.cli", "--data-dir", str(data)]
    if code == B.REPO:  # this version's: every tool, and the attach choice explicit (a baseline knows neither)
        env["MEMRL_TOOL_PROFILE"] = "full"
        args += ["--no-attach"] if runtime is None else []
    if runtime is not None:
        env["MEMRL_RUNTIME_DIR"] = str(runtime)
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(code))
    client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog)))
    pids = [child_pid(str(data))]
    if runtime is not None:
        pids.append(child_pid(str(data), parent=pids[0]))  # the local server the relay started
    yield Server(name, client, pids)


async def age(srv: Server, tasks: list[str], times: int, seed: int, max_passes: int) -> tuple[int, int]:
    """Recall and report the tasks in turn until each memory of the ``aged`` namespace was updated ``times``
    times (or ``max_passes`` passes); (passes, the fewest updates of a memory)."""
    memories = await srv.store(tasks, "aged")
    rng, visits, passes = random.Random(seed), dict.fromkeys(memories, 0), 0
    while passes < max_passes and min(visits.values()) < times:
        visits |= await srv.cycles(tasks, "aged", rng)
        passes += 1
    return passes, min(visits.values())


async def main_async(args: argparse.Namespace) -> int:
    tasks = task_texts(args.tasks, args.seed)
    print(f"cycle_cost: {B.machine()}; {len(tasks)} tasks; {args.rounds} rounds x {args.passes} passes per kind")
    with tempfile.TemporaryDirectory(prefix="memrl-cycle-", dir="/tmp") as tmp:
        root = Path(tmp)
        if args.attach:
            sides = {"attached": (B.REPO, root / "run"), "own-process": (B.REPO, None)}
        else:
            sides = {"this": (B.REPO, None), args.baseline: (baseline_tree(args.baseline, root / "baseline"), None)}
        log = (root / "servers.log").open("w")
        async with AsyncExitStack() as stack:
            if args.attach:
                await stack.enter_async_context(stopped_local_server(root / "run", root / "data" / "attached"))
            servers = [await stack.enter_async_context(server(stack, name, code, root / "data" / name, log, runtime))
                       for name, (code, runtime) in sides.items()]  # fmt: skip
            for srv in servers:
                start = time.perf_counter()
                passes, fewest = await age(srv, tasks, args.age, args.seed, args.max_age_passes)
                print(f"  {srv.name}: aged in {time.perf_counter() - start:.0f} s ({passes} passes; every memory "
                      f"updated >= {fewest} times)", flush=True)  # fmt: skip
            for round_ in range(args.rounds):
                for srv in servers if round_ % 2 == 0 else servers[::-1]:
                    for kind in KINDS:
                        await srv.measured(kind, tasks, args.passes, args.seed + round_)
                line = ", ".join(f"{s.name} {kind} {1000 * s.cpu[kind][-1]:.2f}" for s in servers for kind in KINDS)
                print(f"  round {round_ + 1}: ms of server CPU per cycle: {line}", flush=True)
        log.close()
    this, base = servers
    print("\nserver CPU per recall -> report cycle over MCP stdio, medians of the rounds:")
    rows = []
    for kind in KINDS:
        ratios = [a / b for a, b in zip(this.cpu[kind], base.cpu[kind], strict=True)]
        walls = [a / b for a, b in zip(this.wall[kind], base.wall[kind], strict=True)]
        rows.append((kind, 1000 * statistics.median(base.cpu[kind]), 1000 * statistics.median(this.cpu[kind]),
                     statistics.median(ratios), min(ratios), max(ratios), 1000 * statistics.median(base.wall[kind]),
                     1000 * statistics.median(this.wall[kind]), statistics.median(walls)))  # fmt: skip
    headers = (
        "memories",
        f"{base.name} ms",
        f"{this.name} ms",
        "ratio",
        "min",
        "max",
        "wall: base ms",
        "this ms",
        "ratio",
    )
    print(B.table(headers, rows))
    for srv in servers:
        flat = [full / fresh for full, fresh in zip(srv.cpu["full"], srv.cpu["fresh"], strict=True)]
        print(f"{srv.name}: full / fresh {statistics.median(flat):.2f} (rounds {min(flat):.2f}-{max(flat):.2f})")
    if args.attach:  # the relay's share, read within each block: free of the noise between blocks
        shares = {kind: statistics.median(this.first[kind]) for kind in KINDS}
        print("the relay's share of the attached side's CPU: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
    return 0


@asynccontextmanager
async def stopped_local_server(runtime: Path, data: Path) -> AsyncIterator[None]:
    """Stop the local server of ``data`` once the sessions have closed (it would otherwise wait for its idle time)."""
    yield
    env = {"PYTHONPATH": str(B.REPO), "MEMRL_RUNTIME_DIR": str(runtime)}
    command = [sys.executable, "-m", "memrl_mcp.cli", "local", "stop", "--data-dir", str(data)]
    subprocess.run(command, env=env, cwd=str(B.REPO), capture_output=True, check=False, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit to compare with (default {BASELINE})")
    parser.add_argument("--attach", action="store_true", help="attached against a process of its own (docstring)")
    parser.add_argument("--tasks", type=int, default=20, help="task texts (memories per namespace)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each measures both versions, alternating")
    parser.add_argument("--passes", type=int, default=4, help="passes over the tasks per kind and round")
    parser.add_argument("--age", type=int, default=64, help="updates of each memory before the full blocks")
    parser.add_argument("--max-age-passes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
