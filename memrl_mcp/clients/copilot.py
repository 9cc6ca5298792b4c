"""GitHub Copilot CLI's hook format: it installs the Claude Code plugin (``integrations/claude-code``) unchanged and
runs its hooks under Claude Code's event names, with snake_case payloads of its own, and reads its own answers.

- ``UserPromptSubmit``, ``PreToolUse`` (the memory's report: Copilot names it ``memrl-report_outcome``),
  ``PostToolUse``, ``Stop`` and ``SessionEnd`` are the loop's steps (:mod:`memrl_mcp.clients.core`); a turn that dies
  of an API error fires ``ErrorOccurred`` and no ``Stop``: nothing to record.
- The project is ``COPILOT_PROJECT_DIR`` (also given as ``CLAUDE_PROJECT_DIR``), else the event's working folder.
- A shell call (``bash``, which its Claude-format hooks name ``Bash``) succeeds whatever its exit code: ``PostToolUse``
  carries ``tool_result.text_result_for_llm``, whose last line is ``<shellId: 0 completed with exit code N>``
  (:func:`~memrl_mcp.clients.checks.stated_exit`). A call the user or a rule refused ran nothing.
- Copilot reads a top-level ``additionalContext`` only (never ``hookSpecificOutput``'s), and a top-level permission
  decision; a hold is a ``block`` decision, whose reason Copilot sends as the user's next prompt (the core knows it
  as its own), then says ``stop_hook_active`` at the next stop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memrl_mcp.clients.checks import is_edit, shell_command, stated_exit
from memrl_mcp.clients.core import Client, HookEvent, Step, ToolRun

RAN = ("success", "failure")
"""The results of a tool call that ran (not ``rejected``, ``denied``, ``timeout``)."""


class Copilot:
    """Copilot CLI's events and answers (module docstring)."""

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
            environ.get("COPILOT_PROJECT_DIR") or environ.get("CLAUDE_PROJECT_DIR") or data.get("cwd"),
            data.get("prompt", ""),
            stop_hook_active=data.get("stop_hook_active") is True,
            tool=_tool_run(data),
        )

    def context(self, text: str) -> dict[str, Any]:
        return {"additionalContext": text}

    def hold(self, reason: str) -> dict[str, Any]:
        return {"decision": "block", "reason": reason}

    def memory_environ(self, environ: Mapping[str, str]) -> Mapping[str, str]:
        return environ  # the plugin's MCP server gets the environment its hooks get, as in Claude Code

    def permit(self) -> dict[str, Any]:
        return {
            "permissionDecision": "allow",
            "permissionDecisionReason": "memrl-mcp: a report writes to the memory only",
        }


def _tool_run(data: Mapping[str, Any]) -> ToolRun | None:
    """What a PostToolUse event says a tool call showed (module docstring)."""
    tool, given, result = data.get("tool_name"), data.get("tool_input"), data.get("tool_result")
    if data.get("hook_event_name") != "PostToolUse" or not isinstance(tool, str) or not isinstance(given, dict):
        return None
    shown = result if isinstance(result, dict) else {}
    if shown.get("result_type") not in RAN:
        return None
    if is_edit(tool, given):
        return ToolRun(edited=True)
    command = shell_command(tool, given)
    if command is None:
        return None
    output, code = stated_exit("copilot", str(shown.get("text_result_for_llm", "")))
    return ToolRun(command, output, code)


CLIENT: Client = Copilot()  # checked against the protocol: every method the hooks call
