"""What the local memory server costs and saves: the first answer of a stdio session that attaches to a running
server against a cold start, the resident memory of the server with N sessions attached, and a hook's connect and
one call from a fresh process.

Each figure is a real process started as a client starts it (``python -m memrl_mcp.cli`` over stdio, driven by the
MCP SDK's client), on a store and a runtime folder of the run's own:

- **cold**: no server runs; from spawning ``memrl-mcp`` to the answer of its first call (``initialize``, then
  ``memory_stats``), attached (the relay starts the local server) and in a process of its own (``--no-attach``),
  ``--cold`` times each, alternating, each on a new store;
- **attach**: a server runs; the same, ``--runs`` times (each session closed before the next);
- **memory**: the local server's resident set (``VmRSS``) with 0, 1, 5, 10 and ``--sessions`` sessions attached
  and each having made one recall, and the relays' own;
- **hook**: a fresh ``python -c`` that imports :class:`memrl_mcp.local.attach.LocalClient`, connects and makes one
  ``recall_experience``; wall time of the whole process, and of the connect + call inside it.

    /work/main/.venv/bin/python perf/attach.py                 # 20 attaches, up to 20 sessions, 20 hooks
    /work/main/.venv/bin/python perf/attach.py --runs 5 --sessions 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TextIO

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

HOOK = """
import json, sys, time
started = time.perf_counter()
from memrl_mcp.local.client import LocalClient
imported = time.perf_counter()
with LocalClient.open() as memory:
    memory.call_tool("recall_experience", {"task": "deploy the web app to staging"})
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "call_s": done - imported}))
"""


def session(env: dict[str, str], *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "memrl_mcp.cli", *args], env=env, cwd=tempfile.gettempdir()
    )


async def first_answer(params: StdioServerParameters, errlog: TextIO) -> float:
    """Seconds from spawning the session to the answer of its first call."""
    started = time.perf_counter()
    async with Client(stdio_client(params, errlog=errlog)) as client:
        await client.call_tool("memory_stats", {})
        return time.perf_counter() - started


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def local(env: dict[str, str], action: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "local", action], env=env, capture_output=True, text=True, timeout=300
    )
    return done.stdout


def server_pid(env: dict[str, str]) -> int:
    return int(local(env, "status").split("pid ")[1].split(",")[0])


def relays(data: Path) -> list[int]:
    """The relay processes of this run (children of this process running ``memrl_mcp.cli`` on ``data``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (entry / "environ").read_bytes()
            except OSError:
                continue
            if ppid == os.getpid() and f"MEMRL_DATA_DIR={data}".encode() in cmdline:
                found.append(int(entry.name))
    return found


async def main_async(args: argparse.Namespace) -> int:
    print(f"attach: {B.machine()}")
    with tempfile.TemporaryDirectory(prefix="mrl-attach-", dir="/tmp") as tmp:
        root = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
        base |= {"PYTHONPATH": str(B.REPO), "MEMRL_TOOL_PROFILE": "full"}
        env = base | {"MEMRL_DATA_DIR": str(root / "data"), "MEMRL_RUNTIME_DIR": str(root / "run")}
        own = base | {"MEMRL_DATA_DIR": str(root / "own")}
        errlog = (root / "sessions.log").open("w")
        cold: dict[str, list[float]] = {"attached": [], "own process": []}
        for run in range(args.cold):  # alternating which goes first (the second finds the files cached), new stores
            for kind in ("own process", "attached") if run % 2 == 0 else ("attached", "own process"):
                fresh = {"MEMRL_DATA_DIR": str(root / f"cold-{run}-{kind.replace(' ', '-')}")}
                if kind == "attached":
                    cold[kind].append(await first_answer(session(env | fresh), errlog))
                    local(env | fresh, "stop")
                else:
                    cold[kind].append(await first_answer(session(own | fresh, "--no-attach"), errlog))
        cold["attached"].append(await first_answer(session(env), errlog))  # the server of the runs below
        attach = [await first_answer(session(env), errlog) for _ in range(args.runs)]
        print(f"cold start, first answer, median of {args.cold + 1} and {args.cold}: attached (the relay starts the "
              f"server) {B.p50(cold['attached']):.2f} s (runs {min(cold['attached']):.2f}-"
              f"{max(cold['attached']):.2f}), own process {B.p50(cold['own process']):.2f} s (runs "
              f"{min(cold['own process']):.2f}-{max(cold['own process']):.2f})")  # fmt: skip
        print(f"attach to a running server, first answer over {args.runs} sessions: median {B.p50(attach):.3f} s, "
              f"p90 {B.pct(attach, 90):.3f} s, min {min(attach):.3f}, max {max(attach):.3f}")  # fmt: skip

        pid = server_pid(env)
        rows = [(0, rss_kb(pid) / 1024, "-")]
        async with AsyncExitStack() as stack:
            clients: list[Client] = []
            for count in sorted({1, 5, 10, args.sessions}):
                while len(clients) < count:
                    client = await stack.enter_async_context(Client(stdio_client(session(env), errlog=errlog)))
                    await client.call_tool("recall_experience", {"task": f"session {len(clients)} task"})
                    clients.append(client)
                time.sleep(1)
                relay_kb = [rss_kb(relay) for relay in relays(root / "data")]
                rows.append((count, rss_kb(pid) / 1024, f"{B.p50(relay_kb) / 1024:.1f}"))
        print("\nresident memory with N sessions attached (each made one recall):")
        print(B.table(("sessions", "server MB", "one relay MB (median)"), rows))

        hooks = []
        for _ in range(args.hooks):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", HOOK], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            hooks.append((time.perf_counter() - started, json.loads(done.stdout)))
        whole = [seconds for seconds, _ in hooks]
        inner = [inside["call_s"] for _, inside in hooks]
        imports = [inside["import_s"] for _, inside in hooks]
        print(f"\nhook (fresh process, LocalClient: connect + initialize + one recall), {args.hooks} runs: whole "
              f"process median {B.p50(whole):.3f} s (p90 {B.pct(whole, 90):.3f}); inside it, import "
              f"{1000 * B.p50(imports):.0f} ms, connect + call {1000 * B.p50(inner):.1f} ms")  # fmt: skip
        local(env, "stop")
        errlog.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", type=int, default=4, help="cold starts of each kind, alternating")
    parser.add_argument("--runs", type=int, default=20, help="sessions attached one after another")
    parser.add_argument("--sessions", type=int, default=20, help="most sessions attached at once")
    parser.add_argument("--hooks", type=int, default=20, help="hook processes, one after another")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
