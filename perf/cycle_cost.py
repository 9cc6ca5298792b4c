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

    /work/main/.venv/bin/python perf/cycle_cost.py                     # 5 rounds of 4 passes over 20 tasks
    /work/main/.venv/bin/python perf/cycle_cost.py --rounds 2 --passes 1 --tasks 5 --age 3       # a tiny run
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


def child_pid(marker: str) -> int:
    """The pid of this process's child whose command line holds ``marker`` (the server's own data folder)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ppid == os.getpid() and marker in cmdline:
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
    """One version's stdio server, its client and the CPU each kind of block cost it, per round (s per cycle)."""

    name: str
    client: Client
    pid: int
    cpu: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    fresh_namespaces: int = 0

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
        rng, spent = random.Random(seed), 0.0
        for _ in range(passes):
            namespace = "aged"
            if kind == "fresh":
                self.fresh_namespaces += 1
                namespace = f"fresh-{self.fresh_namespaces}"
                await self.store(tasks, namespace)
            before = cpu_seconds(self.pid)
            await self.cycles(tasks, namespace, rng)
            spent += cpu_seconds(self.pid) - before
        self.cpu[kind].append(spent / (passes * len(tasks)))


@asynccontextmanager
async def server(stack: AsyncExitStack, name: str, code: Path, data: Path, errlog: TextIO) -> AsyncIterator[Server]:
    env = {"PYTHONPATH": str(code), "MEMRL_TOOL_PROFILE": "full"} if name == "this" else {"PYTHONPATH": str(code)}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "memrl_mcp.cli", "--data-dir", str(data)], env=env, cwd=str(code)
    )
    client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog)))
    yield Server(name, client, child_pid(str(data)))


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
    with tempfile.TemporaryDirectory(prefix="memrl-cycle-") as tmp:
        root = Path(tmp)
        code = {"this": B.REPO, args.baseline: baseline_tree(args.baseline, root / "baseline")}
        log = (root / "servers.log").open("w")
        async with AsyncExitStack() as stack:
            servers = [await stack.enter_async_context(server(stack, name, code[name], root / name, log))
                       for name in code]  # fmt: skip
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
        rows.append((kind, 1000 * statistics.median(base.cpu[kind]), 1000 * statistics.median(this.cpu[kind]),
                     statistics.median(ratios), min(ratios), max(ratios)))  # fmt: skip
    headers = ("memories", f"{base.name} ms", "this ms", "this / baseline", "min", "max")
    print(B.table(headers, rows))
    for srv in servers:
        flat = [full / fresh for full, fresh in zip(srv.cpu["full"], srv.cpu["fresh"], strict=True)]
        print(f"{srv.name}: full / fresh {statistics.median(flat):.2f} (rounds {min(flat):.2f}-{max(flat):.2f})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit to compare with (default {BASELINE})")
    parser.add_argument("--tasks", type=int, default=20, help="task texts (memories per namespace)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each measures both versions, alternating")
    parser.add_argument("--passes", type=int, default=4, help="passes over the tasks per kind and round")
    parser.add_argument("--age", type=int, default=64, help="updates of each memory before the full blocks")
    parser.add_argument("--max-age-passes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
