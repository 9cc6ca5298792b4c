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
  its output as a flat string and no exit code: the runner's summary alone tells how a check went
  (:func:`~memrl_mcp.clients.checks.recognise`). An edit is ``apply_patch``.
- Codex's ``Stop`` takes no context (its output has no ``hookSpecificOutput``): a hold is a ``block`` decision, whose
  reason Codex hands the model as a new prompt, then says ``stop_hook_active`` at the next stop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memrl_mcp.clients.checks import is_edit, shell_command
from memrl_mcp.clients.claude_code import ClaudeCode
from memrl_mcp.clients.core import HookEvent, Step, ToolRun


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
    return None if command is None or not isinstance(output, str) else ToolRun(command, output)


CLIENT = Codex()
