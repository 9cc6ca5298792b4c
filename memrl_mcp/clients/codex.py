"""Codex CLI's hook format: it runs the Claude Code plugin's hooks (``integrations/claude-code/hooks/hooks.json``) as
they are, with Claude Code's event names and payloads, but reads other answers, and fires fewer events.

- ``UserPromptSubmit``, ``PreToolUse`` (the memory's report: Codex names it ``mcp__memrl__report_outcome``),
  ``PostToolUse``, ``Stop`` and ``SessionEnd`` are the loop's steps (:mod:`memrl_mcp.clients.core`); Codex has no
  failure events (no ``PostToolUseFailure``, no ``StopFailure``: a turn that dies of an API error fires no
  ``Stop``).
- The project is the event's working folder: Codex names no project folder to its hooks (and sends its MCP servers
  no roots: the plugin's manifest for Codex names the same folder to the memory's server, ``MEMRL_PROJECT_DIR=.``).
- A prompt is always the user's: Codex injects none but a held stop's reason (``<hook_prompt ...>``), which the core
  knows as its own.
- A shell call (``exec_command``, which Codex's hooks name ``Bash``) reaches ``PostToolUse`` whatever its exit code,
  its output as a flat string and no exit code. Codex writes the exit code into the session's transcript (the
  event's ``transcript_path``: ``item_completed`` of the ``CommandExecution`` with the call's id, written before the
  hook runs), where it is read (:func:`stated_exit`); a transcript without it leaves the runner's summary alone to tell
  how a check went (:func:`~memrl_mcp.clients.checks.recognise`). An edit is ``apply_patch``.
- Codex's ``Stop`` takes no context (its output has no ``hookSpecificOutput``): a hold is a ``block`` decision, whose
  reason Codex hands the model as a new prompt, then says ``stop_hook_active`` at the next stop."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import Any

from memrl_mcp.clients.checks import is_edit, shell_command
from memrl_mcp.clients.claude_code import ClaudeCode
from memrl_mcp.clients.core import Client, HookEvent, Step, ToolRun


class Codex(ClaudeCode):
    """Codex's events and answers (module docstring): Claude Code's context and permission, its own events and
    hold."""

    steps: Mapping[str, Step] = {
        "user-prompt-submit": "prompt",
        "pre-tool-use": "permit",
        "post-tool-use": "tool",
        "stop": "stop",
        "session-end": "end",
    }

    def event(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> HookEvent:
        return HookEvent.checked(
            data.get("session_id"),
            data.get("cwd"),
            data.get("prompt", ""),
            stop_hook_active=data.get("stop_hook_active") is True,
            tool=_tool_run(data),
        )

    def hold(self, reason: str) -> dict[str, Any]:
        return {"decision": "block", "reason": reason}


def _tool_run(data: Mapping[str, Any]) -> ToolRun | None:
    """What a PostToolUse event says a tool call showed (module docstring)."""
    tool, given = data.get("tool_name"), data.get("tool_input")
    if data.get("hook_event_name") != "PostToolUse" or not isinstance(tool, str) or not isinstance(given, dict):
        return None
    if is_edit(tool, given):
        return ToolRun(edited=True)
    command, output = shell_command(tool, given), data.get("tool_response")
    if command is None or not isinstance(output, str):
        return None
    return ToolRun(command, output, stated_exit(data.get("transcript_path"), data.get("tool_use_id")))


TRANSCRIPT_TAIL = 4 << 20  # the newest bytes of a transcript read: the call just ended, its record is at the end


def stated_exit(transcript: Any, call_id: Any) -> int | None:
    """The exit code Codex's transcript records for the shell call ``call_id`` (module docstring); None where it
    records none, or where the transcript is not a regular file (a FIFO, a device: never waited on)."""
    if not isinstance(transcript, str) or not os.path.isabs(transcript) or not isinstance(call_id, str) or not call_id:
        return None
    try:
        fd = os.open(transcript, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as stream:
        size = os.fstat(fd)
        if not stat.S_ISREG(size.st_mode):
            return None
        stream.seek(max(0, size.st_size - TRANSCRIPT_TAIL))
        lines = stream.read(TRANSCRIPT_TAIL).splitlines()
    marker = json.dumps(call_id).encode()
    for line in reversed(lines):
        if marker in line and b"item_completed" in line:
            code = _command_exit(line, call_id)
            if code is not None:
                return code
    return None


def _command_exit(line: bytes, call_id: str) -> int | None:
    """The exit code of an ``item_completed`` line of the transcript, when it is the command ``call_id``'s."""
    try:
        payload = json.loads(line).get("payload")
    except (ValueError, AttributeError):
        return None
    item = payload.get("item") if isinstance(payload, dict) and payload.get("type") == "item_completed" else None
    if not isinstance(item, dict) or item.get("type") != "CommandExecution" or item.get("id") != call_id:
        return None
    code = item.get("exit_code")
    return code if type(code) is int else None


CLIENT: Client = Codex()  # checked against the protocol: every method the hooks call
