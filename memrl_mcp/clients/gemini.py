"""Gemini CLI's hook format (the extension in ``integrations/gemini-cli/``): ``BeforeAgent``, ``AfterTool`` (of the
shell and the editing tools), ``AfterAgent`` and ``SessionEnd`` as the loop's steps (:mod:`memrl_mcp.clients.core`),
their answers in the JSON Gemini CLI reads.

The project is ``GEMINI_PROJECT_DIR`` (the folder Gemini CLI runs in, whose real path is the first root its MCP client
offers), else the event's working folder. Every ``BeforeAgent`` prompt is the user's but one: a held stop's reason,
which Gemini CLI sends back as the next prompt (the core knows its own hold, :meth:`SessionRecord.echoes`). Headless,
Gemini CLI puts the context of ``SessionStart`` hooks before the prompt (``<hook_context>...</hook_context>``): not
the user's words, so not the task. An API error fires no ``AfterAgent`` (its ``SessionEnd`` may fire, and closes
the recall with its evidence): no step for it.

Gemini CLI gives an extension's MCP server its environment without the variables whose names look like secrets
(:data:`WITHHELD`; its hooks get them): the hooks read the memory's settings without them too, or a setting such as
``MEMRL_OPENAI_API_KEY`` would make their session's settings differ from the MCP server's, and the local server
would refuse one of the two.

``run_shell_command`` fires ``AfterTool`` whatever its exit code, stated in the tool's text for the model
(``Exit Code: N`` when not 0; :func:`~memrl_mcp.clients.checks.stated_exit`); a call that failed to run (denied,
cancelled) carries an ``error`` and says nothing of the task."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memrl_mcp.clients.checks import is_edit, shell_command, stated_exit
from memrl_mcp.clients.core import Client, HookEvent, Step, ToolRun

WITHHELD = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|AUTH|CREDENTIAL|CREDS|PRIVATE|CERT", re.IGNORECASE)
"""The names of the variables Gemini CLI (0.61, ``sanitizeEnvironment``) keeps from MCP servers, but those beginning
``GEMINI_CLI_`` or ``GIT_CONFIG_``. It also keeps back values shaped like credentials (a URL with a password, a
GitHub token): not mirrored, the memory's settings that hold such values are named so. In GitHub Actions
(``GITHUB_SHA`` set) it keeps every variable but a few from its hooks as well: both get the same."""
SESSION_CONTEXT = re.compile(r"\A<hook_context>.*?</hook_context>\n\n", re.DOTALL)
"""What headless Gemini CLI puts before the prompt when a ``SessionStart`` hook adds context."""


class GeminiCli:
    """Gemini CLI's events and answers (module docstring)."""

    steps: Mapping[str, Step] = {
        "before-agent": "prompt",
        "after-tool": "tool",
        "after-agent": "stop",
        "session-end": "end",
    }

    def event(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> HookEvent:
        prompt = data.get("prompt", "")
        if data.get("hook_event_name") == "BeforeAgent" and isinstance(prompt, str):
            prompt = SESSION_CONTEXT.sub("", prompt, count=1)
        return HookEvent.checked(
            data.get("session_id"),
            environ.get("GEMINI_PROJECT_DIR") or data.get("cwd"),
            prompt if data.get("hook_event_name") == "BeforeAgent" else "",
            stop_hook_active=data.get("stop_hook_active") is True,
            tool=_tool_run(data),
        )

    def context(self, text: str) -> dict[str, Any]:
        return {"hookSpecificOutput": {"hookEventName": "BeforeAgent", "additionalContext": text}}

    def hold(self, reason: str) -> dict[str, Any]:
        # AfterAgent has no quieter way: a "block" decision sends the reason to the model as the next prompt.
        return {"decision": "block", "reason": reason}

    def memory_environ(self, environ: Mapping[str, str]) -> Mapping[str, str]:
        return {
            name: value
            for name, value in environ.items()
            if name.upper().startswith(("GEMINI_CLI_", "GIT_CONFIG_")) or not WITHHELD.search(name)
        }

    def permit(self) -> dict[str, Any]:
        # Never asked (no hook of the extension is this step): a hook cannot allow a tool in Gemini CLI, only its
        # policy can (docs/gemini-cli.md).
        return {}


def _tool_run(data: Mapping[str, Any]) -> ToolRun | None:
    """What an AfterTool event says a tool call showed (module docstring)."""
    tool, given, response = data.get("tool_name"), data.get("tool_input"), data.get("tool_response")
    if data.get("hook_event_name") != "AfterTool" or not isinstance(tool, str) or not isinstance(given, dict):
        return None
    if not isinstance(response, dict) or response.get("error"):
        return None
    if is_edit(tool, given):
        return ToolRun(edited=True)
    command, text = shell_command(tool, given), response.get("llmContent")
    if tool != "run_shell_command" or command is None or not isinstance(text, str):
        return None
    output, code = stated_exit("gemini", text)
    return None if code is None else ToolRun(command, output, code)


CLIENT: Client = GeminiCli()  # checked against the protocol: every method the hooks call
