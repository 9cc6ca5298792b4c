"""GitHub Copilot CLI as the tests run it (tests/copilot, ``make node``): offline, its model faked (Chat
Completions, :mod:`tests.support.chat_completions`), the plugin of integrations/claude-code installed unchanged from
the repository's marketplace, one headless session (``copilot -p``) at a time; and the model the tests give it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl_mcp.clients.core import RECALLED
from tests.support.agents import HOLD, LEARNED, ROOT, TASK, AgentUser, npm_cli, recall_id_in
from tests.support.chat_completions import FakeModel, Reply, Script, tool_calls

REPORT = "memrl-report_outcome"  # Copilot names an MCP server's tools <server>-<tool>
SESSION_S = 180


def said(request: dict[str, Any], role: str) -> list[str]:
    """The texts of a request's messages of ``role``, in order."""
    found = []
    for message in request.get("messages") or []:
        content = message.get("content")
        if message.get("role") == role and content:
            parts = [content] if isinstance(content, str) else [part.get("text", "") for part in content]
            found.append("\n".join(parts))
    return found


def holds(model: FakeModel) -> list[str]:
    """The held stops the model read in its last request (Copilot sends each reason as the user's next prompt)."""
    return [text for text in said(model.requests[-1], "user") if HOLD in text]


def the_model(command: str | None = None) -> Script:
    """A model that does what the hooks' words ask: it runs ``command`` if given, says it is done, and reports the
    recall a held stop names, once, as a success."""

    def reply(request: dict[str, Any]) -> Reply:
        held = [text for text in said(request, "user") if HOLD in text]
        reported = {call["recall_id"] for call in tool_calls(request, REPORT)}
        if held and recall_id_in(held[-1]) not in reported:
            arguments = {"recall_id": recall_id_in(held[-1]), "reward": 1.0, "experience": LEARNED}
            return Reply(tool=REPORT, arguments=arguments)
        if command is not None and not tool_calls(request, "bash"):
            return Reply(tool="bash", arguments={"command": command, "description": "run the tests"})
        return Reply("All done, it works." if command else "Done.")

    return reply


def copilot(user: AgentUser, *args: str, cwd: Path = ROOT, **env: str) -> Any:
    """Copilot CLI offline: no GitHub login, no network but the model's (COPILOT_OFFLINE)."""
    offline = {"COPILOT_OFFLINE": "true", "COPILOT_PROVIDER_API_KEY": "sk-fake", "COPILOT_MODEL": "fake-model"}
    return user.run([str(npm_cli("copilot", "copilot")), *args], cwd, SESSION_S, **offline | env)


def install(user: AgentUser) -> None:
    for step in (("marketplace", "add", str(ROOT)), ("install", "memrl@memrl-mcp")):
        done = copilot(user, "plugin", *step)
        assert done.returncode == 0, done.stdout + done.stderr


def session(user: AgentUser, project: Path, model: FakeModel, *allowed: str) -> str:
    """``copilot -p TASK`` in ``project``, with only the tools ``allowed`` (the memory's report is allowed by the
    plugin's own hook)."""
    flags = [f"--allow-tool={tool}" for tool in allowed]
    done = copilot(user, "-p", TASK, *flags, cwd=project, COPILOT_PROVIDER_BASE_URL=f"{model.url}/v1")
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


def context_of(model: FakeModel) -> str:
    """What the prompt hook added to the first prompt (Copilot appends it in a system_reminder)."""
    (prompt,) = said(model.requests[0], "user")
    assert RECALLED in prompt, prompt
    return prompt[prompt.index(RECALLED) :]
