"""The Claude Code plugin's real hooks, driven as Claude Code drives them: the harness's edge to the plugin.

A run with the plugin (``--evidence hooks``, ``--discipline hooked``) is a user of it. Its memory is served by the
store's local server (:mod:`memrl_mcp.local`), in a runtime folder of the run's own, and each episode is a Claude Code
session in the run's project folder. The hooks are the commands of the plugin's hooks/hooks.json (:data:`HOOKS`, which
a test holds to that file): one ``memrl-mcp hook EVENT`` process per event, through a shell, with the event's JSON on
stdin as Claude Code writes it and ``CLAUDE_PROJECT_DIR`` set, killed past the file's timeout. The agent's MCP session
is the plugin's .mcp.json server (``memrl-mcp`` over stdio, attached to the same local server), with the project
folder as its root. Nothing of the hooks is modelled here: what the agent knows of its memory is what the prompt hook
put into its context (:func:`memories_in`), and the recall it reports is the one named there or in the stop hook's
hold (:func:`recall_id_in`).

A session (:class:`Session`): ``UserPromptSubmit`` with the task; ``PostToolUse`` of an Edit for each file the agent
edited, then of the Bash command that checked its work when it exited 0, else ``PostToolUseFailure`` (``error``:
``Exit code N`` and the output); ``Stop``, which the hook holds once while the recall waits for its report (as
context for the model's next turn, its reason naming the recall and what the evidence said); the agent's report
through its MCP session; ``Stop`` again (``stop_hook_active``); ``SessionEnd``.

The run's memory settings reach every hook and session as ``MEMRL_*`` variables (:meth:`RunSettings.environment`):
every session of a local server must have the server's settings of the memory, and a hook given a settings file
loads them (half a second, of a hook's quarter of a second without).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client

from memrl_harness.benchmarks.base import Memory, ShellRun
from memrl_harness.results import RunDir
from memrl_mcp.local.place import place_of
from memrl_mcp.projects import folder_uri

HOOKS: Mapping[str, tuple[str, float]] = {
    "UserPromptSubmit": ("memrl-mcp hook user-prompt-submit", 30),
    "PostToolUse": ("memrl-mcp hook post-tool-use", 10),
    "PostToolUseFailure": ("memrl-mcp hook post-tool-use-failure", 10),
    "Stop": ("memrl-mcp hook stop", 15),
    "SessionEnd": ("memrl-mcp hook session-end", 10),
}
"""The hook command and its timeout in seconds, per Claude Code event, as the plugin's hooks/hooks.json gives them."""
BIN = Path(sys.executable).parent  # where the installation put memrl-mcp
ENTRY = re.compile(
    r'^\d+\. (success|failure), q (-?[\d.]+), (?:untried|\d+ rewards?), [^":]*: (".*")(?: \(shortened.*\))?$'
)
"""A memory's line in the hook's context: its trust, its age and origin (``3 days old, from claude-code``), its text."""
RECALL_ID = re.compile(r'recall_id "([0-9a-f-]{36})"')


class PluginError(RuntimeError):
    """A hook of the plugin failed, or took longer than Claude Code waits."""


def memories_in(context: str | None) -> list[Memory]:
    """The memories the prompt hook's context shows, best first, as the agent reads them: each one's outcome, q and
    experience (its id is its number there: the context names no id)."""
    memories: list[Memory] = []
    for line in (context or "").split("\n"):
        if entry := ENTRY.match(line):
            outcome: Literal["success", "failure"] = "success" if entry.group(1) == "success" else "failure"
            experience, q = json.loads(entry.group(3)), float(entry.group(2))
            memories.append(Memory(f"#{len(memories) + 1}", "", experience, outcome, q, 0.0))
    return memories


def recall_id_in(text: str | None) -> str | None:
    """The recall id the hook's own words name (the context's last line, or a hold's reason); a memory's text, quoted,
    cannot write one (its quotes are escaped)."""
    found = RECALL_ID.findall(text or "")
    return found[-1] if found else None


class Plugin:
    """The plugin installed for one run (module docstring): the environment its hooks and sessions share, the project
    folder, and the log of what the hooks wrote on stderr."""

    def __init__(self, run_dir: RunDir, settings: Mapping[str, str], runtime: Path) -> None:
        self.project = (run_dir.path / "project").resolve()
        self.project.mkdir(parents=True, exist_ok=True)
        self.log, self.server_log = run_dir.path / "hooks.log", run_dir.server_log
        self.environ = get_default_environment() | {
            **settings,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "MEMRL_DATA_DIR": str(run_dir.memory_dir.resolve()),
            "MEMRL_RUNTIME_DIR": str(runtime),
            "CLAUDE_PROJECT_DIR": str(self.project),
        }

    @asynccontextmanager
    async def client(self, **callbacks: Any) -> AsyncIterator[Client]:
        """The agent's MCP session (module docstring), offered every tool: the runner seeds and reads the memory
        through it too."""

        async def roots(context: Any) -> types.ListRootsResult:
            return types.ListRootsResult(roots=[types.Root(uri=folder_uri(self.project))])

        environ = self.environ | {"MEMRL_TOOL_PROFILE": "full", "MEMRL_LOG_CALLS": "true"}
        server = StdioServerParameters(command=str(BIN / "memrl-mcp"), env=environ, cwd=self.project)
        with self.server_log.open("a") as log:
            async with Client(stdio_client(server, errlog=log), list_roots_callback=roots, **callbacks) as client:
                yield client

    def session(self, session_id: str) -> Session:
        return Session(self, session_id)

    async def stop(self) -> None:
        """Stop the local server (``memrl-mcp local stop`` waits until it has let the store go)."""
        done = await anyio.run_process([str(BIN / "memrl-mcp"), "local", "stop"], env=self.environ, check=False)
        if done.returncode != 0:
            raise PluginError(f"memrl-mcp local stop failed: {done.stderr.decode(errors='replace').strip()}")


@asynccontextmanager
async def installed(run_dir: RunDir, settings: Mapping[str, str]) -> AsyncIterator[Plugin]:
    """The plugin for one run, its local server stopped at the end, its log added to the run's server log, and its
    runtime folder removed (short, under /tmp: a socket's path has at most about 100 bytes)."""
    runtime = Path(tempfile.mkdtemp(prefix="mrl", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        plugin = Plugin(run_dir, settings, runtime)
        try:
            yield plugin
        finally:
            with anyio.CancelScope(shield=True):
                await plugin.stop()
            served = place_of(run_dir.memory_dir.resolve(), runtime).log  # the local server's log, kept with the run
            if served.exists():
                with run_dir.server_log.open("a") as log:
                    log.write(served.read_text(errors="replace"))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


@dataclass(frozen=True)
class Session:
    """One Claude Code session with the plugin (module docstring): each method is one hook event."""

    plugin: Plugin
    session_id: str

    async def prompt(self, text: str) -> str | None:
        """The user's prompt; the context the hook adds to it (None: none)."""
        answer = await self._hook("UserPromptSubmit", prompt=text)
        return None if answer is None else str(answer["hookSpecificOutput"]["additionalContext"])

    async def edited(self, path: str) -> None:
        """The agent's Edit tool changed ``path`` (relative to the project)."""
        where = str(self.plugin.project / path)
        given = {"file_path": where, "old_string": "", "new_string": ""}
        await self._hook("PostToolUse", tool_name="Edit", tool_input=given, tool_response={"filePath": where})

    async def ran(self, run: ShellRun) -> None:
        """The agent's Bash tool ran ``run``: PostToolUse when it exited 0, else PostToolUseFailure."""
        given = {"tool_name": "Bash", "tool_input": {"command": run.command, "description": "run the tests"}}
        if run.exit_code == 0:
            shown = {"stdout": run.output, "stderr": "", "interrupted": False, "isImage": False}
            await self._hook("PostToolUse", **given, tool_response=shown)
        else:
            await self._hook("PostToolUseFailure", **given, error=f"Exit code {run.exit_code}\n{run.output}")

    async def stop(self, active: bool = False) -> str | None:
        """The end of the agent's turn; the reason the hook holds it for (None: it lets the session stop)."""
        answer = await self._hook("Stop", stop_hook_active=active, last_assistant_message="Done.")
        held = (answer or {}).get("hookSpecificOutput", {})  # a hold is context for the model's next turn
        return str(held["additionalContext"]) if held.get("hookEventName") == "Stop" else None

    async def end(self) -> None:
        await self._hook("SessionEnd", reason="other")

    async def _hook(self, event: str, **fields: Any) -> dict[str, Any] | None:
        """Run ``event``'s hook as Claude Code does; its answer (None: it printed none)."""
        command, timeout = HOOKS[event]
        project = self.plugin.project
        payload = {
            "session_id": self.session_id,
            "transcript_path": str(project / ".claude" / f"{self.session_id}.jsonl"),
            "cwd": str(project),
            "permission_mode": "default",
            "hook_event_name": event,
            **fields,
        }
        try:
            with anyio.fail_after(timeout):
                done = await anyio.run_process(
                    ["/bin/sh", "-c", command], input=json.dumps(payload).encode(), env=self.plugin.environ,
                    cwd=project, check=False,
                )  # fmt: skip
        except TimeoutError:
            raise PluginError(f"{command} took more than Claude Code's {timeout:g} s") from None
        if done.stderr:
            with self.plugin.log.open("a") as log:
                log.write(f"{event} ({self.session_id}): {done.stderr.decode(errors='replace')}")
        if done.returncode != 0:
            raise PluginError(f"{command} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}")
        answer: dict[str, Any] | None = json.loads(done.stdout) if done.stdout.strip() else None
        return answer
