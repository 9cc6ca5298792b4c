"""Codex CLI as the tests run it (tests/codex, ``make node``): configured for a fake model (the Responses API,
:mod:`tests.support.openai_responses`), the plugin of integrations/claude-code installed from the repository's
marketplace, one headless session (``codex exec``) at a time; and the model the tests give it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agents import HOLD, LEARNED, ROOT, TASK, AgentUser, npm_cli, recall_id_in
from tests.support.openai_responses import FakeModel, Reply, Script, function_calls

REPORT, RECALL = "mcp__memrl__report_outcome", "mcp__memrl__recall_experience"
SESSION_S = 180
CONFIG = """model = "fake-model"
model_provider = "fake"

[model_providers.fake]
name = "fake"
base_url = "http://127.0.0.1:1/v1"
env_key = "FAKE_OPENAI_KEY"
wire_api = "responses"
"""
"""Codex's configuration: the fake model's provider (its address given to each session). Hooks are on by default
(0.171: no ``[features] hooks``)."""


def texts(request: dict[str, Any], role: str) -> list[str]:
    """The texts of a request's input messages of ``role`` (a tool's output counts as ``tool``), in order."""
    found = []
    for item in request.get("input") or []:
        if item.get("type") == "function_call_output" and role == "tool":
            found.append(str(item.get("output")))
        elif item.get("type") == "message" and item.get("role") == role:
            found += [part["text"] for part in item.get("content") or [] if "text" in part]
    return found


def holds(model: FakeModel) -> list[str]:
    """The held stops the model read in its last request (Codex sends each as a user message)."""
    return [text for text in texts(model.requests[-1], "user") if HOLD in text]


def the_model(recall_first: bool = False, command: str | None = None) -> Script:
    """A model that does what the hooks' words ask: it runs ``command`` if given, recalls by itself first with
    ``recall_first``, says it is done, and reports the recall a held stop names, once, as a success."""

    def reply(request: dict[str, Any]) -> Reply:
        held = [text for text in texts(request, "user") if HOLD in text]
        reported = {call["recall_id"] for call in function_calls(request, REPORT)}
        if held and recall_id_in(held[-1]) not in reported:
            arguments = {"recall_id": recall_id_in(held[-1]), "reward": 1.0, "experience": LEARNED}
            return Reply(tool=REPORT, arguments=arguments)
        if recall_first and not function_calls(request, RECALL):
            return Reply(tool=RECALL, arguments={"task": TASK})
        if command is not None and not function_calls(request, "exec_command"):
            return Reply(tool="exec_command", arguments={"cmd": command})
        return Reply("All done, it works." if command else "Done.")

    return reply


def codex(user: AgentUser, *args: str, cwd: Path = ROOT, **env: str) -> Any:
    return user.run([str(npm_cli("codex", "codex")), *args], cwd, SESSION_S, FAKE_OPENAI_KEY="sk-fake", **env)


def install(user: AgentUser) -> None:
    """Codex configured for the fake model, the plugin installed from the repository's marketplace."""
    (user.home / ".codex").mkdir()
    (user.home / ".codex" / "config.toml").write_text(CONFIG)
    for step in (("marketplace", "add", str(ROOT)), ("add", "memrl@memrl-mcp")):
        done = codex(user, "plugin", *step)
        assert done.returncode == 0, done.stdout + done.stderr


def session(user: AgentUser, project: Path, model: FakeModel, prompt: str = TASK) -> str:
    """``codex exec PROMPT`` in ``project``: hooks run untrusted (``--dangerously-bypass-hook-trust``, what ``/hooks``
    does once in the TUI), commands unsandboxed (this machine has no bubblewrap for Codex's sandbox)."""
    flags = ["--dangerously-bypass-hook-trust", "--dangerously-bypass-approvals-and-sandbox"]
    where = ["-c", f'model_providers.fake.base_url="{model.url}/v1"']
    done = codex(user, "exec", *flags, *where, prompt, cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)
