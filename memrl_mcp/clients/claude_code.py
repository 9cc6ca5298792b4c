"""Claude Code's hook format (the plugin in ``integrations/claude-code/``): ``UserPromptSubmit``, ``PreToolUse`` (of
the memory's report only), ``PostToolUse`` and ``PostToolUseFailure``, ``Stop``, ``StopFailure`` and ``SessionEnd``
as the loop's steps
(:mod:`memrl_mcp.clients.core`), their answers in the JSON Claude Code reads.

The project is ``CLAUDE_PROJECT_DIR`` (the folder Claude Code was opened in, as its roots say), else the event's
working folder. A prompt is a task when the user typed it or gave it to ``claude -p`` (:data:`PROMPTED`). A Bash
call that exits 0 fires ``PostToolUse`` (its stdout and stderr merged in ``tool_response.stdout``); one that does not
fires ``PostToolUseFailure`` alone, whose ``error`` is ``Exit code N`` and the output; a call interrupted says
nothing of the task."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memrl_mcp.clients.checks import is_edit, stated_exit
from memrl_mcp.clients.core import Client, HookEvent, Step, ToolRun

PROMPTED = (None, "user", "sdk")
"""The sources of a prompt that is a task: typed by the user, or given to ``claude -p``; not one the client
injected (a task notification, a loop's wake-up)."""


class ClaudeCode:
    """Claude Code's events and answers (module docstring)."""

    steps: Mapping[str, Step] = {
        "user-prompt-submit": "prompt",
        "pre-tool-use": "permit",
        "post-tool-use": "tool",
        "post-tool-use-failure": "tool",
        "stop": "stop",
        "stop-failure": "failed-stop",
        "session-end": "end",
    }

    def event(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> HookEvent:
        source = data.get("source")
        return HookEvent.checked(
            data.get("session_id"),
            environ.get("CLAUDE_PROJECT_DIR") or data.get("cwd"),
            data.get("prompt", ""),
            is_task=(source if isinstance(source, str) else None) in PROMPTED,
            stop_hook_active=data.get("stop_hook_active") is True,
            tool=_tool_run(data),
        )

    def context(self, text: str) -> dict[str, Any]:
        return {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": text}}

    def hold(self, reason: str) -> dict[str, Any]:
        # As context, not a "block" decision: Claude Code shows a block as "Stop hook error"; context makes the model
        # take another turn as well, quietly (its next Stop says stop_hook_active).
        return {"hookSpecificOutput": {"hookEventName": "Stop", "additionalContext": reason}}

    def memory_environ(self, environ: Mapping[str, str]) -> Mapping[str, str]:
        return environ  # its plugin's MCP server gets the environment its hooks get

    def permit(self) -> dict[str, Any]:
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": "memrl-mcp: a report writes to the memory only",
            }
        }


def _tool_run(data: Mapping[str, Any]) -> ToolRun | None:
    """What a PostToolUse or PostToolUseFailure event says a tool call showed (module docstring)."""
    name, tool, given = data.get("hook_event_name"), data.get("tool_name"), data.get("tool_input")
    if name not in ("PostToolUse", "PostToolUseFailure") or not isinstance(tool, str) or not isinstance(given, dict):
        return None
    if is_edit(tool, given):
        return ToolRun(edited=True)
    command = given.get("command")
    if tool != "Bash" or not isinstance(command, str) or data.get("is_interrupt") is True:
        return None
    if name == "PostToolUseFailure":
        output, code = stated_exit("claude-code", str(data.get("error", "")))
        return ToolRun(command, output, code)
    response = data.get("tool_response")
    if isinstance(response, dict) and response.get("interrupted") is True:
        return None
    shown = response if isinstance(response, dict) else {}
    return ToolRun(command, f"{shown.get('stdout', '')}{shown.get('stderr', '')}", 0)


CLIENT: Client = ClaudeCode()  # checked against the protocol: every method the hooks call
