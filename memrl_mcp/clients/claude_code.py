"""Claude Code's hook format (the plugin in ``integrations/claude-code/``): ``UserPromptSubmit``, ``Stop`` and
``SessionEnd`` as the loop's steps (:mod:`memrl_mcp.clients.core`), their answers in the JSON Claude Code reads.

The project is ``CLAUDE_PROJECT_DIR`` (the folder Claude Code was opened in, as its roots say), else the event's
working folder. A prompt is a task when the user typed it or gave it to ``claude -p`` (:data:`PROMPTED`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memrl_mcp.clients.core import HookEvent, Step

PROMPTED = (None, "user", "sdk")
"""The sources of a prompt that is a task: typed by the user, or given to ``claude -p``; not one the client
injected (a task notification, a loop's wake-up)."""


class ClaudeCode:
    """Claude Code's events and answers (module docstring)."""

    steps: Mapping[str, Step] = {"user-prompt-submit": "prompt", "stop": "stop", "session-end": "end"}

    def event(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> HookEvent:
        source = data.get("source")
        return HookEvent.checked(
            data.get("session_id"),
            environ.get("CLAUDE_PROJECT_DIR") or data.get("cwd"),
            data.get("prompt", ""),
            is_task=(source if isinstance(source, str) else None) in PROMPTED,
            stop_hook_active=data.get("stop_hook_active") is True,
        )

    def context(self, text: str) -> dict[str, Any]:
        return {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": text}}

    def hold(self, reason: str) -> dict[str, Any]:
        return {"decision": "block", "reason": reason}


CLIENT = ClaudeCode()
