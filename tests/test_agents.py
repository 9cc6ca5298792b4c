"""One memory across agents: a user with Codex CLI, Claude Code and GitHub Copilot CLI, each with the plugin of
integrations/claude-code installed from the repository's marketplace by its own command, and Gemini CLI with the
extension of integrations/gemini-cli installed by its own (``gemini extensions install``, the policy copied, the
folder trusted), all with one local server and one store, each run with only its model faked over HTTP. What a task
in Codex taught is recalled in Claude Code (by its prompt's hook and by its model through Claude Code's own MCP
session), in Copilot and in Gemini CLI (by its BeforeAgent hook), in the same repository; not in another
repository (Gemini CLI's session there)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from memrl_mcp.clients.core import RECALLED
from memrl_mcp.surface.text import NO_MEMORY
from tests.support import codex_cli, copilot_cli, gemini_cli
from tests.support.agents import LEARNED, ROOT, TASK, AgentUser, agent_user
from tests.support.anthropic import FakeModel as ClaudeModel
from tests.support.anthropic import fake_model as claude_model
from tests.support.chat_completions import fake_model as copilot_model
from tests.support.gemini import fake_gemini
from tests.support.openai_responses import fake_model as codex_model
from tests.test_claude_code import TOOLS, claude, said, the_model

DEADLINE_S = 480  # five agents' sessions and a cold start of the memory, on a loaded machine


@pytest.fixture
def user(tmp_path: Path) -> Iterator[AgentUser]:
    """The user, each agent with the plugin or the extension, the memory's local server running (docs/codex.md,
    docs/copilot.md, docs/gemini-cli.md)."""
    with agent_user(tmp_path) as found:
        codex_cli.install(found)
        copilot_cli.install(found)
        gemini_cli.install_extension(found.home)
        for step in (("marketplace", "add", str(ROOT)), ("install", "memrl@memrl-mcp")):
            done = claude(found.home, "plugin", *step, cwd=ROOT, **found.env())
            assert done.returncode == 0, done.stdout + done.stderr
        warm = found.store.local("ui")
        assert warm.returncode == 0, warm.stdout + warm.stderr
        yield found


def claude_session(user: AgentUser, project: Path, model: ClaudeModel) -> dict[str, Any]:
    """``claude -p TASK`` in ``project`` with the user's environment, the memory's recall allowed (the plugin's hook
    allows the report)."""
    fake = {"ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-fake", "ENABLE_TOOL_SEARCH": "false"}
    allowed = ["--allowedTools", f"{TOOLS}recall_experience"]
    done = claude(user.home, "-p", TASK, "--output-format", "json", *allowed, cwd=project,
                  **user.env(MCP_CONNECTION_NONBLOCKING="0", **fake))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def claude_context(model: ClaudeModel) -> str:
    text = "\n".join(said(message) for message in model.requests[0]["messages"])
    assert RECALLED in text, text
    return text


@pytest.mark.slow  # four agents' CLIs, the memory's local server
@pytest.mark.anyio
async def test_what_codex_learned_is_recalled_in_claude_code_copilot_and_gemini_in_the_same_repository_only(
    user: AgentUser,
) -> None:
    alpha, beta = user.project("alpha"), user.project("beta")
    with anyio.fail_after(DEADLINE_S):
        with codex_model(codex_cli.the_model()) as model:
            await anyio.to_thread.run_sync(codex_cli.session, user, alpha, model)
        assert len(codex_cli.holds(model)) == 1  # once held, and Codex's model reported LEARNED

        with claude_model(the_model(recall_first=True)) as model:
            result = await anyio.to_thread.run_sync(claude_session, user, alpha, model)
        assert result["result"] == "Done." and not result["is_error"], result
        assert LEARNED in claude_context(model)
        assert LEARNED in said(model.requests[1]["messages"][-1])  # Claude Code's MCP session: the same memory

        with copilot_model(copilot_cli.the_model()) as model:
            await anyio.to_thread.run_sync(copilot_cli.session, user, alpha, model)
        assert LEARNED in copilot_cli.context_of(model)

        shell = {"XDG_RUNTIME_DIR": str(user.runtime)}
        with fake_gemini(gemini_cli.the_model()) as gemini:
            await anyio.to_thread.run_sync(lambda: gemini_cli.session(user.home, alpha, gemini, **shell))
        assert LEARNED in gemini_cli.recalled(gemini)  # its BeforeAgent hook's context

        with fake_gemini(gemini_cli.the_model()) as gemini:
            await anyio.to_thread.run_sync(lambda: gemini_cli.session(user.home, beta, gemini, **shell))
        context = gemini_cli.recalled(gemini)
        assert NO_MEMORY in context and LEARNED not in context
