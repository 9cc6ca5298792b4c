"""Codex CLI with the plugin of integrations/claude-code, installed the way Codex installs plugins (``codex plugin
marketplace add`` of the repository, ``codex plugin add memrl@memrl-mcp``) and run headless (``codex exec``): its
real hooks and MCP client against the real memory, with only its model faked over HTTP (the Responses API,
tests/support/openai_responses.py). Codex itself is installed by ``make node`` (tests/codex/package.json and its
lock). The events Codex sends, as captured from it (tests/data/agent_tool_events.json), are read without it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from memrl_mcp.clients import client_named
from memrl_mcp.clients.codex import CLIENT, stated_exit
from memrl_mcp.clients.core import RECALLED, ToolRun
from memrl_mcp.surface.text import NO_MEMORY
from tests.support.agents import LEARNED, ROOT, AgentUser, agent_user, recall_id_in, recall_state
from tests.support.codex_cli import holds, install, session, texts, the_model
from tests.support.openai_responses import fake_model

PLUGIN = ROOT / "integrations" / "claude-code"
EVENTS = json.loads((ROOT / "tests" / "data" / "agent_tool_events.json").read_text())
DEADLINE_S = 300  # a cold start of the memory on a loaded machine, then a few Codex sessions


# -- Codex's events, read without Codex ------------------------------------------------------------------------------


def test_codexs_events_are_read_as_it_sends_them(tmp_path: Path) -> None:
    """Codex's own events (captured from it): the project is the working folder, even where the hook inherits
    another agent's project variable; a shell call's flat output with no exit code; an MCP call is no tool run."""
    shell = {**EVENTS["codex PostToolUse"], "transcript_path": str(tmp_path / "gone.jsonl")}
    event = CLIENT.event(shell, {"CLAUDE_PROJECT_DIR": "/elsewhere", "PLUGIN_DATA": "/d"})
    assert (event.session_id, event.project) == (shell["session_id"], Path(shell["cwd"]))
    assert event.tool == ToolRun(shell["tool_input"]["command"], shell["tool_response"], None)  # no transcript here
    assert CLIENT.event(EVENTS["codex PostToolUse mcp"], {}).tool is None
    patch = {**shell, "tool_name": "apply_patch", "tool_input": {"command": "*** Begin Patch\n*** End Patch\n"}}
    assert CLIENT.event(patch, {}).tool == ToolRun(edited=True)
    assert CLIENT.hold("R") == {"decision": "block", "reason": "R"}  # Codex's Stop takes no context


TRANSCRIPT = [  # the records Codex 0.171 writes of a shell call, in order (a real rollout file's, shortened)
    {"type": "response_item", "payload": {"type": "function_call", "name": "exec_command", "call_id": "call_7",
                                          "arguments": "{\"cmd\": \"make test\"}"}},
    {"type": "event_msg", "payload": {"type": "item_completed", "item": {"type": "CommandExecution", "id": "call_7",
                                      "command": ["/bin/bash", "-lc", "make test"], "status": "failed",
                                      "aggregated_output": "make: *** [Makefile:2: test] Error 1\n", "exit_code": 2}}},
    {"type": "response_item", "payload": {"type": "function_call_output", "call_id": "call_7",
                                          "output": "Process exited with code 2\nOutput:\n..."}},
]  # fmt: skip


def test_the_exit_code_is_read_from_codexs_transcript(tmp_path: Path) -> None:
    """Codex gives its hook no exit code but writes it into the session's transcript before the hook runs: read
    there, for that call only; a transcript that is not a regular file (a FIFO nobody writes, a device) is not
    waited on, and a damaged or foreign one says nothing."""
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_text("\n".join(json.dumps(record) for record in TRANSCRIPT) + "\n{not json\n")
    assert stated_exit(str(transcript), "call_7") == 2
    assert stated_exit(str(transcript), "call_8") is None
    shell = {**EVENTS["codex PostToolUse"], "transcript_path": str(transcript), "tool_use_id": "call_7"}
    assert CLIENT.event(shell, {}).tool == ToolRun(shell["tool_input"]["command"], shell["tool_response"], 2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert stated_exit(str(fifo), "call_7") is None and stated_exit("/dev/zero", "call_7") is None
    assert time.monotonic() - started < 1
    for garbage in (None, 3, "relative.jsonl", str(tmp_path / "missing.jsonl")):
        assert stated_exit(garbage, "call_7") is None
    assert stated_exit(str(transcript), None) is None


def test_codexs_hooks_are_told_apart_by_the_plugins_environment() -> None:
    """Codex gives its plugin's hooks PLUGIN_DATA (Claude Code and Copilot CLI do not); what Codex gives its shell
    commands (CODEX_HOME, CODEX_SESSION_ID) reaches an agent started from them, whose hooks stay that agent's."""
    assert type(client_named(None, {"PLUGIN_DATA": "/home/a/.codex/plugins/data/memrl-memrl-mcp"})).__name__ == "Codex"
    inherited = {"CODEX_HOME": "/home/a/.codex", "CODEX_SESSION_ID": "s", "CLAUDE_PLUGIN_ROOT": str(PLUGIN)}
    assert type(client_named(None, inherited)).__name__ == "ClaudeCode"


def test_the_plugins_manifest_for_codex_is_the_plugins_and_names_its_project_and_store() -> None:
    """Codex reads .codex-plugin/plugin.json before .claude-plugin/plugin.json: the same plugin, whose MCP server
    (which Codex starts in the session's folder, with no roots, a filtered environment) takes its project from its
    working folder and is given the variables that name the store and its runtime folder."""
    claude = json.loads((PLUGIN / ".claude-plugin" / "plugin.json").read_text())
    codex = json.loads((PLUGIN / ".codex-plugin" / "plugin.json").read_text())
    server = codex.pop("mcpServers")["memrl"]
    assert {**codex, "homepage": claude["homepage"]} == claude
    assert server["command"] == "memrl-mcp" and server["env"] == {"MEMRL_PROJECT_DIR": "."}
    assert {"MEMRL_CONFIG", "MEMRL_DATA_DIR", "MEMRL_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"} <= set(
        server["env_vars"]
    )


# -- Codex itself ----------------------------------------------------------------------------------------------------


@pytest.fixture
def user(tmp_path: Path) -> Iterator[AgentUser]:
    """The user, Codex with the plugin, and the memory's local server already running: Codex lists an MCP server's
    tools once it answers, and a headless turn shorter than the memory's cold start (its model loads: seconds on a
    loaded machine) ends before its model can report (docs/codex.md)."""
    with agent_user(tmp_path) as found:
        install(found)
        warm = found.store.local("ui")
        assert warm.returncode == 0, warm.stdout + warm.stderr
        yield found


@pytest.mark.slow  # Codex's CLI, the memory's local server
@pytest.mark.anyio
async def test_codex_runs_the_loop_with_the_plugin(user: AgentUser) -> None:
    """The first session in a repository recalls nothing and is held once; the model reports through Codex's own
    MCP session. The second in the same repository gets what was reported, in its prompt's context and in its
    model's own recall through Codex's MCP session (whose project, from its working folder, is the hooks'); a
    session in another repository gets nothing. Codex's hooks have XDG_RUNTIME_DIR and its MCP server has not: they
    meet one local server. Each task is held exactly once."""
    alpha, beta = user.project("alpha"), user.project("beta")
    with anyio.fail_after(DEADLINE_S):
        with fake_model(the_model()) as model:
            assert "Done." in await anyio.to_thread.run_sync(session, user, alpha, model)
        (context,) = [text for text in texts(model.requests[0], "developer") if text.startswith(RECALLED)]
        assert NO_MEMORY in context
        (held,) = holds(model)
        assert recall_id_in(held) == recall_id_in(context)
        state = await recall_state(user, recall_id_in(held))
        assert (state["status"], state["reward"]) == ("reported", 1.0)

        with fake_model(the_model(recall_first=True)) as model:
            await anyio.to_thread.run_sync(session, user, alpha, model)
        (context,) = [text for text in texts(model.requests[0], "developer") if text.startswith(RECALLED)]
        assert LEARNED in context
        (own,) = [text for text in texts(model.requests[1], "tool")]
        assert LEARNED in own  # Codex's MCP session recalls in the hooks' project
        (held,) = holds(model)
        assert recall_id_in(held) == recall_id_in(context)

        with fake_model(the_model()) as model:
            await anyio.to_thread.run_sync(session, user, beta, model)
        (context,) = [text for text in texts(model.requests[0], "developer") if text.startswith(RECALLED)]
        assert NO_MEMORY in context and LEARNED not in context
        assert len(holds(model)) == 1


MAKEFILE = "test:\n\t@echo running the tests\n\t@exit 1\n"


@pytest.mark.slow  # Codex's CLI, the memory's local server
@pytest.mark.anyio
async def test_a_failing_check_in_codex_decides_the_reward_over_the_models_claim(user: AgentUser) -> None:
    """The model runs ``make test`` through Codex's shell, which fails with no runner's summary to read (only its
    exit code says so, and Codex writes that into its transcript alone), says it works and reports success: the
    hold tells it what the tests said, and the reward is the tests'."""
    project = user.project("alpha")
    (project / "Makefile").write_text(MAKEFILE)
    with anyio.fail_after(DEADLINE_S):
        with fake_model(the_model(command="make test")) as model:
            await anyio.to_thread.run_sync(session, user, project, model)
        (held,) = holds(model)
        assert "its tests run said it failed" in held, held
        state = await recall_state(user, recall_id_in(held))
        assert (state["status"], state["reward"], state["reward_source"]) == ("reported", -1.0, "tests")
        (check,) = state["evidence"]
        assert (check["kind"], check["passed"], check["command"]) == ("tests", False, "make test")
