"""What the Claude Code plugin's hooks cost a prompt: each hook run as Claude Code runs it (the command of
integrations/claude-code/hooks/hooks.json through ``/bin/sh``, the event's JSON on stdin), a fresh process each time,
against a running local server, on a store and a runtime folder of the run's own.

- **prompt, memories found**: UserPromptSubmit for a prompt like stored memories (recall, record, context out);
- **prompt, nothing found**: the same for a prompt like no memory (recall and record; the context says so);
- **stop, held**: Stop with one recall pending (asks the server, holds: context for the model's next turn);
- **stop, nothing waiting**: Stop with every recall settled (reads the record, never connects);
- **python**: ``python -c pass`` of the same interpreter, the floor of any fresh Python process.

Kinds alternate run by run, so that a change of the machine's load falls on all of them alike. Also printed: the
characters each prompt's hook added to the model's context (p50, p90, max), over prompts each like a few of
``--memories`` stored experiences of 300 to 20,000 characters (the default ``max_recall_chars`` bounds them).

    /work/main/.venv/bin/python perf/claude_hooks.py            # 20 runs of each
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

PLUGIN = B.REPO / "integrations" / "claude-code"
TASK = "deploy the web app to the staging cluster"


def command(event: str) -> str:
    (entry,) = json.loads((PLUGIN / "hooks" / "hooks.json").read_text())["hooks"][event]
    return str(entry["hooks"][0]["command"])


def run(shell: str, event: Mapping[str, object], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(["/bin/sh", "-c", shell], input=json.dumps(event), env=env, cwd=cwd, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return time.perf_counter() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--memories", type=int, default=40, help="experiences stored for the context's sizes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hooks-"))
    project, runtime = work / "project", Path(tempfile.mkdtemp(prefix="mrl", dir="/tmp"))  # a socket's path is short
    project.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEMRL_")}
    env |= {"MEMRL_DATA_DIR": str(work / "data"), "MEMRL_RUNTIME_DIR": str(runtime)}
    env |= {"CLAUDE_PROJECT_DIR": str(project), "CLAUDE_PLUGIN_ROOT": str(PLUGIN)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    try:
        measure(env, project, args.runs, args.memories)
    finally:
        local_stop = [sys.executable, "-m", "memrl_mcp.cli", "local", "stop"]
        subprocess.run(local_stop, env=env, check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def measure(env: dict[str, str], project: Path, runs: int, memories: int) -> None:
    common = {"transcript_path": str(project / "t.jsonl"), "cwd": str(project), "permission_mode": "default"}

    def prompt(text: str, session: str) -> Callable[[], tuple[float, str]]:
        event = {**common, "session_id": session, "hook_event_name": "UserPromptSubmit", "prompt": text}
        return lambda: run(command("UserPromptSubmit"), event, env, project)

    def stop(session: str) -> tuple[float, str]:
        event = {**common, "session_id": session, "hook_event_name": "Stop", "stop_hook_active": False}
        return run(command("Stop"), event, env, project)

    seed = {**common, "session_id": "seed", "hook_event_name": "UserPromptSubmit", "prompt": TASK}
    cold, _ = run(command("UserPromptSubmit"), seed, env, project)  # starts the server
    store = subprocess.run(
        [sys.executable, "-c", STORE, TASK, str(project), str(memories)], env=env, check=True, capture_output=True,
        text=True,
    )  # fmt: skip
    assert store.returncode == 0, store.stderr
    sizes: list[float] = []
    kinds: dict[str, list[float]] = {k: [] for k in ("prompt, memories found", "prompt, nothing found", "stop, held",
                                                      "stop, nothing waiting", "python -c pass")}  # fmt: skip
    for i in range(runs):
        seconds, out = prompt("deploy the web app to staging", f"found-{i}")()
        assert "additionalContext" in out, out
        kinds["prompt, memories found"].append(seconds)
        seconds, out = prompt("translate the release notes into German", f"empty-{i}")()
        assert "additionalContext" in out, out  # found or not, the hook says it recalled
        kinds["prompt, nothing found"].append(seconds)
        seconds, out = stop(f"found-{i}")
        assert '"hookEventName": "Stop"' in out, out
        kinds["stop, held"].append(seconds)
        for n in range(2):  # prompts like the stored experiences: what a prompt's context weighs
            _, out = prompt(f"{TOPICS[(2 * i + n) % len(TOPICS)]} for the release", f"size-{i}-{n}")()
            sizes.append(len(json.loads(out)["hookSpecificOutput"]["additionalContext"]))
        seconds, out = stop(f"found-{i}")
        assert out == "", out
        kinds["stop, nothing waiting"].append(seconds)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        kinds["python -c pass"].append(time.perf_counter() - started)
    rows = [
        (kind, B.p50(values) * 1000, B.pct(values, 90) * 1000, max(values) * 1000) for kind, values in kinds.items()
    ]
    print(f"cold start (the first prompt's hook starts the server): {cold:.2f} s")
    print(B.table(("hook (fresh process)", "median ms", "p90 ms", "max ms"), rows))
    print(f"context a prompt's hook added, over {len(sizes)} prompts: p50 {B.p50(sizes):.0f} characters, "
          f"p90 {B.pct(sizes, 90):.0f}, max {max(sizes):.0f}")  # fmt: skip


TOPICS = ("rotate the TLS certificates", "migrate the orders database", "fix the flaky login test",
          "upgrade the payment SDK", "tune the search index", "repair the nightly backup")  # fmt: skip
STORE = f"""
import random, sys
from memrl_mcp.local.client import LocalClient
from memrl_mcp.projects import folder_uri
TOPICS = {TOPICS!r}
SIZES = (300, 800, 1500, 3000, 6000, 20000)  # characters of an experience: from a line to a long write-up
WORDS = ("check", "the", "config", "run", "tests", "then", "deploy")
steps = random.Random(7)
with LocalClient.open(roots=[folder_uri(sys.argv[2])]) as memory:
    memory.call_tool("store_experience", {{"task": sys.argv[1], "experience": "make deploy ENV=staging"}})
    for i in range(int(sys.argv[3])):
        words = " ".join(steps.choice(WORDS) for _ in range(4000))
        experience = words[: steps.choice(SIZES)]
        task = f"{{TOPICS[i % len(TOPICS)]}} of service {{i}}"
        memory.call_tool("store_experience", {{"task": task, "experience": experience}})
"""

if __name__ == "__main__":
    main()
