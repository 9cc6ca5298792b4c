"""GitHub Copilot CLI with the plugin of integrations/claude-code, installed unchanged the way Copilot installs
plugins (``copilot plugin marketplace add`` of the repository, ``copilot plugin install memrl@memrl-mcp``) and run
headless and offline (``copilot -p``, ``COPILOT_OFFLINE=true``): its real hooks and MCP client against the real
memory, with only its model faked over HTTP (Chat Completions, tests/support/chat_completions.py). Copilot itself is
installed by ``make node`` (tests/copilot/package.json and its lock). The events Copilot sends, as captured from it
(tests/data/agent_tool_events.json), are read without it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from memrl_mcp.clients import client_named
from memrl_mcp.clients.copilot import CLIENT
from memrl_mcp.clients.core import ToolRun
from memrl_mcp.surface.text import NO_MEMORY
from tests.support.agents import LEARNED, ROOT, AgentUser, agent_user, recall_id_in, recall_state
from tests.support.chat_completions import fake_model
from tests.support.copilot_cli import REPORT, context_of, holds, install, session, the_model

PLUGIN = ROOT / "integrations" / "claude-code"
EVENTS = json.loads((ROOT / "tests" / "data" / "agent_tool_events.json").read_text())
DEADLINE_S = 300


# -- Copilot's events, read without Copilot --------------------------------------------------------------------------


def test_copilots_events_are_read_as_it_sends_them() -> None:
    """Copilot's own events (captured from it, the plugin's Claude-format hooks): the project is the folder Copilot
    names; a shell call succeeds whatever its exit code, which its last line states; an MCP call, or a call that was
    refused, is no tool run; an edit is one."""
    shell = EVENTS["copilot PostToolUse"]
    event = CLIENT.event(shell, {"COPILOT_PROJECT_DIR": "/home/a/alpha", "CLAUDE_PROJECT_DIR": "/home/a/alpha"})
    assert (event.session_id, event.project) == (shell["session_id"], Path("/home/a/alpha"))
    assert event.tool == ToolRun("sh -c 'echo boom; exit 3'", "boom", 3)
    assert CLIENT.event(shell, {}).project == Path(shell["cwd"])
    assert CLIENT.event(EVENTS["copilot PostToolUse mcp"], {}).tool is None
    refused = {**shell, "tool_result": {"result_type": "denied", "text_result_for_llm": "Permission denied"}}
    assert CLIENT.event(refused, {}).tool is None
    written = {**shell, "tool_name": "Write", "tool_input": {"path": "/home/a/alpha/x.py", "file_text": "x = 1\n"}}
    assert CLIENT.event(written, {}).tool == ToolRun(edited=True)


def test_copilot_is_answered_in_the_fields_it_reads() -> None:
    """Copilot reads a top-level additionalContext only (a nested hookSpecificOutput one never reaches its model),
    a top-level permission decision, and a block decision to hold the stop; the hooks read the memory's settings
    from their whole environment (the plugin's MCP server gets the same)."""
    assert CLIENT.memory_environ({"MEMRL_DATA_DIR": "/d", "HOME": "/h"}) == {"MEMRL_DATA_DIR": "/d", "HOME": "/h"}
    assert CLIENT.context("C") == {"additionalContext": "C"}
    assert CLIENT.hold("R") == {"decision": "block", "reason": "R"}
    assert CLIENT.permit()["permissionDecision"] == "allow" and "hookSpecificOutput" not in CLIENT.permit()


def test_copilots_hooks_are_told_apart_by_the_plugins_environment() -> None:
    """Copilot gives its plugin's hooks COPILOT_PLUGIN_ROOT; its shell commands get COPILOT_CLI=1, which reaches an
    agent started from them (Claude Code run in Copilot's shell), whose hooks stay that agent's."""
    plugin_hook = {"COPILOT_CLI": "1", "COPILOT_PLUGIN_ROOT": str(PLUGIN), "CLAUDE_PLUGIN_ROOT": str(PLUGIN)}
    assert type(client_named(None, plugin_hook)).__name__ == "Copilot"
    inherited = {"COPILOT_CLI": "1", "COPILOT_AGENT_SESSION_ID": "s", "CLAUDE_PLUGIN_ROOT": str(PLUGIN)}
    assert type(client_named(None, inherited)).__name__ == "ClaudeCode"


def test_the_plugins_hooks_name_copilots_report() -> None:
    """The hook that lets the model report without a permission prompt matches the report as Claude Code and Copilot
    name it (Codex asks no permission for it, and refuses a PreToolUse allow)."""
    (entry,) = json.loads((PLUGIN / "hooks" / "hooks.json").read_text())["hooks"]["PreToolUse"]
    assert set(entry["matcher"].split("|")) == {"mcp__plugin_memrl_memrl__report_outcome", REPORT}


# -- Copilot itself --------------------------------------------------------------------------------------------------


@pytest.fixture
def user(tmp_path: Path) -> Iterator[AgentUser]:
    """The user, Copilot with the plugin, and the memory's local server already running: Copilot waits about 10 s
    for an MCP server's first answer, and falls back to another handshake on the same connection, which the server
    refuses: a cold start slower than that (the model loads, on a loaded machine) loses the session's memory tools
    (docs/copilot.md)."""
    with agent_user(tmp_path) as found:
        install(found)
        warm = found.store.local("ui")
        assert warm.returncode == 0, warm.stdout + warm.stderr
        yield found


@pytest.mark.slow  # Copilot's CLI, the memory's local server
@pytest.mark.anyio
async def test_copilot_runs_the_loop_with_the_plugin(user: AgentUser) -> None:
    """The first session in a repository recalls nothing and is held once; the model reports through Copilot's own
    MCP session, allowed by the plugin's hook (``copilot -p`` denies a tool nobody allowed). The second in the same
    repository gets what was reported in its prompt; a session in another repository gets nothing. Each task is
    held exactly once, though Copilot hands the hold back as the user's next prompt."""
    alpha, beta = user.project("alpha"), user.project("beta")
    with anyio.fail_after(DEADLINE_S):
        with fake_model(the_model()) as model:
            assert "Done." in await anyio.to_thread.run_sync(session, user, alpha, model)
        context = context_of(model)
        assert NO_MEMORY in context
        (held,) = holds(model)
        assert recall_id_in(held) == recall_id_in(context)
        state = await recall_state(user, recall_id_in(held))
        assert (state["status"], state["reward"]) == ("reported", 1.0)

        with fake_model(the_model()) as model:
            await anyio.to_thread.run_sync(session, user, alpha, model)
        context = context_of(model)
        assert LEARNED in context
        (held,) = holds(model)
        assert recall_id_in(held) == recall_id_in(context)
        assert (await recall_state(user, recall_id_in(held)))["status"] == "reported"

        with fake_model(the_model()) as model:
            await anyio.to_thread.run_sync(session, user, beta, model)
        context = context_of(model)
        assert NO_MEMORY in context and LEARNED not in context
        assert len(holds(model)) == 1


MAKEFILE = "test:\n\t@echo running the tests\n\t@exit 1\n"


@pytest.mark.slow  # Copilot's CLI, the memory's local server
@pytest.mark.anyio
async def test_a_failing_check_in_copilot_decides_the_reward_over_the_models_claim(user: AgentUser) -> None:
    """The model runs ``make test`` through Copilot's shell, which fails with no runner's summary (only the exit code
    Copilot states in the result's last line says so), says it works and reports success: the hold tells it what
    the tests said, and the reward is the tests'."""
    project = user.project("alpha")
    (project / "Makefile").write_text(MAKEFILE)
    with anyio.fail_after(DEADLINE_S):
        with fake_model(the_model(command="make test")) as model:
            await anyio.to_thread.run_sync(session, user, project, model, "shell")
        (held,) = holds(model)
        assert "its tests run said it failed" in held, held
        state = await recall_state(user, recall_id_in(held))
        assert (state["status"], state["reward"], state["reward_source"]) == ("reported", -1.0, "tests")
        (check,) = state["evidence"]
        assert (check["kind"], check["passed"], check["command"]) == ("tests", False, "make test")
