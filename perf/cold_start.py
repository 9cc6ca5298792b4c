"""From spawning ``memrl-mcp`` (over stdio, attached: the default) to the answer of its ``tools/list``: what an MCP
client such as Claude Code waits for before its first request can carry the plugin's tools (issue 40.4).

Each run is a real process started as a client starts it (``python -m memrl_mcp.cli``), driven by JSON lines on
its pipes (``initialize``, ``notifications/initialized``, ``tools/list``), on a store and a runtime folder of the
run's own:

- **cold, first ever**: no server runs and the runtime folder is new (nothing cached): the relay answers the
  handshake at once with what it knows (an empty list of tools, the memory starting behind);
- **cold**: no server runs, but an earlier session of the same build and settings left the server's answers in the
  store's runtime folder (the usual cold start: the server had exited idle): the tools' real list at once;
- **warm**: a server runs; the relay passes everything to it.

After each cold run the server the relay started is waited for and stopped, so that the next run is cold again.

    .venv/bin/python perf/cold_start.py              # 7 runs of each
    .venv/bin/python perf/cold_start.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HANDSHAKE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "cold-start", "version": "1"}}


def _line(process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert process.stdin is not None
    process.stdin.write(json.dumps(message).encode() + b"\n")
    process.stdin.flush()


def _answer(process: subprocess.Popen[bytes], request_id: int) -> dict[str, Any]:
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the session ended before answering request {request_id}")
        message: dict[str, Any] = json.loads(line)
        if message.get("id") == request_id and "method" not in message:
            return message


def tools_list(env: dict[str, str]) -> tuple[float, int]:
    """Seconds from spawning a session to the answer of its ``tools/list``, and how many tools it listed."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "memrl_mcp.cli"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    try:
        _line(process, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HANDSHAKE})
        _answer(process, 1)
        _line(process, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _line(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
        listed = _answer(process, 2)
        elapsed = time.perf_counter() - started
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=300)
    return elapsed, len(listed.get("result", {}).get("tools", []))


def local(env: dict[str, str], action: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "local", action], env=env, capture_output=True, text=True, timeout=300
    )
    return done.stdout


def settle(env: dict[str, str]) -> None:
    """Wait for the server a cold run started (``local ui`` waits for it, starting one if none runs), then stop it."""
    local(env, "ui")
    local(env, "stop")
    deadline = time.monotonic() + 60
    while "not running" not in local(env, "status") and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"cold, first ever": [], "cold": [], "warm": []}
    listed: dict[str, set[int]] = {kind: set() for kind in runs}
    with tempfile.TemporaryDirectory(prefix="mrl-cold-", dir="/tmp") as tmp:
        root = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
        base |= {"PYTHONPATH": str(REPO), "MEMRL_TOOL_PROFILE": "full"}
        for run in range(args.runs):
            fresh = base | {"MEMRL_DATA_DIR": str(root / f"first-{run}"), "MEMRL_RUNTIME_DIR": str(root / f"r{run}")}
            seconds, count = tools_list(fresh)
            runs["cold, first ever"].append(seconds)
            listed["cold, first ever"].add(count)
            settle(fresh)
        env = base | {"MEMRL_DATA_DIR": str(root / "data"), "MEMRL_RUNTIME_DIR": str(root / "run")}
        tools_list(env)  # an earlier session: its server's answers are cached
        settle(env)
        for _ in range(args.runs):
            seconds, count = tools_list(env)
            runs["cold"].append(seconds)
            listed["cold"].add(count)
            settle(env)
        local(env, "ui")
        for _ in range(args.runs):
            seconds, count = tools_list(env)
            runs["warm"].append(seconds)
            listed["warm"].add(count)
        local(env, "stop")
    print(f"spawn to tools/list, median of {args.runs} runs (min-max), tools listed:")
    for kind, times in runs.items():
        counts = "/".join(str(count) for count in sorted(listed[kind]))
        print(f"  {kind:17} {statistics.median(times):.3f} s ({min(times):.3f}-{max(times):.3f}), {counts} tools")
    cold, warm = statistics.median(runs["cold"]), statistics.median(runs["warm"])
    print(f"cold / warm: {cold / warm:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
