"""The Gemini CLI extension (integrations/gemini-cli): its events read as the loop reads them, its files, and Gemini
CLI itself (tests/gemini_cli, installed by ``make node``) with the extension installed the way it installs
extensions (tests/support/gemini_cli.py), its model faked over HTTP (tests/support/gemini.py) and everything else
real: the hooks, its MCP client, the memory's server. The hooks' shared semantics (the records, the holds, the
evidence) are tested through Claude Code's in tests/test_claude_code.py; here, what is Gemini CLI's own."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types

from memrl_mcp.clients import client_named
from memrl_mcp.clients.core import HOLD_OPENING, HookInputError, ToolRun
from memrl_mcp.clients.gemini import CLIENT
from memrl_mcp.projects import folder_uri, project_namespace
from memrl_mcp.surface.text import NO_MEMORY
from tests.support.anthropic import Reply, Script
from tests.support.gemini import FakeGemini, calls, fake_gemini, results, texts
from tests.support.gemini_cli import EXTENSION, TOOLS, gemini, holds, install_extension, recalled, session, the_model
from tests.support.local import LocalStore, stop_all
from tests.support.mcp import call, read_json
from tests.test_claude_code import FAILING_TEST, LEARNED, STALE_FIX, TASK, recall_id_in, recall_state

DEADLINE_S = 300  # a session of Gemini CLI takes 10-30 s on a loaded machine; a test runs up to three
SECRET_LIKE = {"MEMRL_OPENAI_API_KEY": "sk-memrl-test-not-used"}  # a setting Gemini keeps from MCP servers only


# -- the events, as Gemini CLI 0.61 sends them (captured from its runs) ----------------------------------------------

BASE = {"session_id": "bc14bc32-3e1d-4ea2-b135-bfe5465088ba", "cwd": "/tmp/p", "timestamp": "2026-12-01T20:43:17Z"}
SHELL = {"command": "sh -c 'echo boom; exit 3'", "description": "fail on purpose"}


def after_tool(tool: str, given: dict[str, Any], response: dict[str, Any]) -> ToolRun | None:
    data = {**BASE, "hook_event_name": "AfterTool", "tool_name": tool, "tool_input": given, "tool_response": response}
    return CLIENT.event(data, {}).tool


def test_what_gemini_clis_tool_events_show() -> None:
    """``run_shell_command``'s exit code is in its text for the model (``Exit Code: N`` when not 0, inside
    ``<untrusted_context>``); a call that did not run (an ``error``), was cancelled or went to the background shows
    nothing; ``write_file`` and ``replace`` are edits; the memory's own tool is neither."""
    failed = {
        "llmContent": "<untrusted_context>\nOutput: boom\nExit Code: 3\nProcess Group PGID: 2567\n</untrusted_context>"
    }
    assert after_tool("run_shell_command", SHELL, failed) == ToolRun(SHELL["command"], "boom", 3)
    passed = {"llmContent": "Output: 3 passed in 0.01s\nProcess Group PGID: 12"}
    assert after_tool("run_shell_command", SHELL, passed) == ToolRun(SHELL["command"], "3 passed in 0.01s", 0)
    cancelled = {"llmContent": "Command was cancelled by user before it could complete. There was no output before it "
                               "was cancelled."}  # fmt: skip
    background = {"llmContent": "Command moved to background (PID: 12). Output hidden. Press Ctrl+B to view."}
    denied = {"llmContent": "Output: boom\nExit Code: 3", "error": {"message": "denied", "type": "policy_violation"}}
    for response in (cancelled, background, denied, {}):
        assert after_tool("run_shell_command", SHELL, response) is None, response
    for tool, given in (("write_file", {"file_path": "a.py", "content": "x"}), ("replace", {"file_path": "a.py"})):
        assert after_tool(tool, given, {"llmContent": "ok"}) == ToolRun(edited=True)
    mcp = {"llmContent": [{"text": "<untrusted_context>\nreported\n</untrusted_context>"}]}
    assert after_tool(f"{TOOLS}report_outcome", {"recall_id": "r", "reward": 1}, mcp) is None


def test_what_gemini_clis_prompt_and_stop_events_say() -> None:
    """The project is GEMINI_PROJECT_DIR; the prompt is the user's words without the context headless Gemini CLI puts
    before them for SessionStart hooks; the stop says whether a stop the hook caused is under way; a field missing
    or of the wrong type is refused by name."""
    prompt = {**BASE, "hook_event_name": "BeforeAgent", "prompt": "<hook_context>CTX\n\nmore</hook_context>\n\nfix it"}
    event = CLIENT.event(prompt, {"GEMINI_PROJECT_DIR": "/tmp/project"})
    assert (event.project, event.prompt, event.is_task) == (Path("/tmp/project"), "fix it", True)
    assert CLIENT.event({**prompt, "prompt": "fix <hook_context>x</hook_context>"}, {}).prompt.startswith("fix <hook")
    stop = {
        **BASE,
        "hook_event_name": "AfterAgent",
        "prompt": "fix it",
        "prompt_response": "Done.",
        "stop_hook_active": True,
    }
    event = CLIENT.event(stop, {})
    assert (event.project, event.prompt, event.stop_hook_active) == (Path("/tmp/p"), "", True)
    for broken, field in (({"session_id": ""}, "session_id"), ({"cwd": "p"}, "cwd"), ({"prompt": 3}, "prompt")):
        with pytest.raises(HookInputError, match=field):
            CLIENT.event({**prompt, **broken}, {})
    assert CLIENT.context("C") == {"hookSpecificOutput": {"hookEventName": "BeforeAgent", "additionalContext": "C"}}
    assert CLIENT.hold("R") == {"decision": "block", "reason": "R"}


def test_the_hooks_read_the_memorys_settings_as_geminis_mcp_server_gets_them() -> None:
    """Gemini CLI keeps from an extension's MCP server the variables whose names look like secrets, not from its
    hooks: the hooks read the memory's settings without them (the real CLI: test_gemini_cli_runs_the_loop...)."""
    given = {"MEMRL_DATA_DIR": "/d", "XDG_RUNTIME_DIR": "/run/user/0", "HOME": "/h", "MEMRL_DISTILL_MAX_TOKENS": "9",
             "GEMINI_API_KEY": "k", "GEMINI_CLI_TRUST_WORKSPACE": "true", **SECRET_LIKE}  # fmt: skip
    kept = CLIENT.memory_environ(given)
    assert set(kept) == {"MEMRL_DATA_DIR", "XDG_RUNTIME_DIR", "HOME", "GEMINI_CLI_TRUST_WORKSPACE"}
    assert client_named("claude-code", {}).memory_environ(given) == given  # Claude Code gives its server the whole


def test_the_extension_names_its_hooks_and_server() -> None:
    """hooks/hooks.json: each hook is ``memrl-mcp hook --client gemini STEP`` of a step of the client, its timeout in
    milliseconds (Gemini CLI's unit); AfterTool's matcher (a regular expression, searched) takes the shell and the
    editing tools alone. The manifest's server is ``memrl-mcp``, named ``memrl`` (its tools ``mcp_memrl_*``)."""
    hooks = json.loads((EXTENSION / "hooks" / "hooks.json").read_text())["hooks"]
    steps = []
    for (entry,) in hooks.values():
        (hook,) = entry["hooks"]
        head, _, step = hook["command"].rpartition(" ")
        assert head == "memrl-mcp hook --client gemini" and step in CLIENT.steps, hook
        assert 1000 <= hook["timeout"] <= 30_000 and hook["type"] == "command", hook
        steps.append(CLIENT.steps[step])
    assert sorted(steps) == sorted(CLIENT.steps.values()) and set(hooks) == {
        "BeforeAgent",
        "AfterTool",
        "AfterAgent",
        "SessionEnd",
    }
    matcher = re.compile(hooks["AfterTool"][0]["matcher"])
    taken = ["run_shell_command", "write_file", "replace", f"{TOOLS}replace", "replace_all", "read_file"]
    assert [name for name in taken if matcher.search(name)] == ["run_shell_command", "write_file", "replace"]
    manifest = json.loads((EXTENSION / "gemini-extension.json").read_text())
    assert manifest["name"] == "memrl" and manifest["mcpServers"] == {"memrl": {"command": "memrl-mcp"}}


# -- Gemini CLI itself ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemini:
    """A user of Gemini CLI with the extension installed: their home folder, the variables of their shell, and the
    store their memory uses (the default one of that home, its runtime folder the default one of that shell)."""

    home: Path
    shell: dict[str, str]
    store: LocalStore

    def session(self, project: Path, model: FakeGemini, *args: str) -> dict[str, Any]:
        return session(self.home, project, model, *args, **self.shell)

    def project(self, name: str) -> Path:
        folder = self.home.parent / "code" / name
        folder.mkdir(parents=True)
        return folder


@contextmanager
def gemini_user(tmp_path: Path, github_actions: bool = False) -> Iterator[Gemini]:
    """A user whose shell has XDG_RUNTIME_DIR (the runtime folder's default) and a setting of the memory whose name
    Gemini keeps from MCP servers; in GitHub Actions (``GITHUB_SHA``), where Gemini keeps nearly every variable
    from its hooks and MCP servers alike, TMPDIR instead. Its local server is stopped at the end."""
    home = tmp_path / "home"
    install_extension(home)
    short = Path(tempfile.mkdtemp(prefix="mrg", dir="/tmp"))  # a socket's path is at most ~100 bytes
    if github_actions:
        shell = {"GITHUB_SHA": "0" * 40, "TMPDIR": str(short)}
        runtime = short / f"memrl-mcp-{os.getuid()}"
    else:
        shell = {"XDG_RUNTIME_DIR": str(short), **SECRET_LIKE}
        runtime = short / "memrl-mcp"
    store = LocalStore(home / ".local" / "share" / "memrl-mcp", runtime)
    store.data_dir.parent.mkdir(parents=True)  # where the test's own sessions run
    try:
        yield Gemini(home, shell, store)
    finally:
        store.local("stop")
        stop_all(runtime)
        store.wait_gone()
        shutil.rmtree(short, ignore_errors=True)


@asynccontextmanager
async def own_session(user: Gemini, project: Path) -> AsyncIterator[Client]:
    """The test's own MCP session of ``project`` (its root) on the user's memory."""

    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=folder_uri(project))])

    async with Client(user.store.session(), list_roots_callback=list_roots, mode="legacy") as client:
        yield client


@pytest.mark.slow  # Gemini CLI itself, the hooks and the memory's server as processes
@pytest.mark.anyio
async def test_gemini_cli_runs_the_loop_with_the_extension(tmp_path: Path) -> None:
    """Gemini CLI with the extension, its model faked: the first session's prompt is recalled for, its end held
    once (the hold comes back as a prompt, recalled for not, and Gemini says stop_hook_active false after the
    report) and reported through Gemini's MCP session; the second session of the repository gets the experience,
    from the hooks and from the model's own recall (the MCP server's namespace, from Gemini's roots, is the hooks'),
    and another repository's does not. The user's shell names the runtime folder by XDG_RUNTIME_DIR and holds a
    setting Gemini keeps from MCP servers: the hooks and the server still share one local server."""
    with gemini_user(tmp_path) as user, anyio.fail_after(DEADLINE_S):
        alpha, beta = user.project("alpha web (v2) caf\u00e9"), user.project("beta")
        with fake_gemini(the_model()) as model:
            first = await anyio.to_thread.run_sync(user.session, alpha, model)
        assert first["response"].endswith("Done."), first
        context = recalled(model)
        assert NO_MEMORY in context, context
        recall_id = recall_id_in(context)
        (held,) = holds(model)
        assert recall_id_in(held) == recall_id
        async with own_session(user, alpha) as client:
            state = await recall_state(client, recall_id)
            assert (state["status"], state["reward"]) == ("reported", 1.0)
            assert state["namespace"] == project_namespace(folder_uri(alpha))

        with fake_gemini(the_model(recall_first=True)) as model:
            await anyio.to_thread.run_sync(user.session, alpha, model)
        assert LEARNED in recalled(model)  # the hooks' recall: what the first session reported
        (own,) = results(model.requests[-1], f"{TOOLS}recall_experience")
        assert LEARNED in own  # the model's own recall, through Gemini's MCP session
        (held,) = holds(model)
        assert recall_id_in(held) != recall_id

        with fake_gemini(the_model()) as model:
            await anyio.to_thread.run_sync(user.session, beta, model)
        context = recalled(model)
        assert NO_MEMORY in context and LEARNED not in context
        assert len(holds(model)) == 1


def sycophant(command: str) -> Script:
    """A model that runs the tests once with Gemini CLI's shell tool, says they pass whatever they showed, and
    reports the held recall as a success, following memory 1."""

    def reply(request: dict[str, Any]) -> Reply:
        held = [text for text in texts(request) if text.startswith(HOLD_OPENING)]
        if held and not calls(request, f"{TOOLS}report_outcome"):
            arguments = {"recall_id": recall_id_in(held[-1]), "reward": 1.0, "experience": STALE_FIX, "followed": [1]}
            return Reply(tool=f"{TOOLS}report_outcome", arguments=arguments)
        if not calls(request, "run_shell_command"):
            return Reply(tool="run_shell_command", arguments={"command": command, "description": "run the tests"})
        return Reply("All the tests pass now. Done.")

    return reply


@pytest.mark.slow  # Gemini CLI itself, the hooks, the memory's server and the project's tests as processes
@pytest.mark.anyio
async def test_a_model_claiming_success_over_failing_tests_cannot_raise_the_memory_it_followed(tmp_path: Path) -> None:
    """The model runs the project's failing tests through Gemini CLI's ``run_shell_command`` (its result says
    ``Exit Code: 1``; AfterTool records the run), says they pass and reports success: the hold tells it what the
    tests said, and the report's reward is the tests', whatever the model claims."""
    command = f"{sys.executable} -m pytest -q -p no:cacheprovider test_dates.py"
    with gemini_user(tmp_path) as user, anyio.fail_after(DEADLINE_S):
        project = user.project("dates")
        (project / "test_dates.py").write_text(FAILING_TEST)
        shell = f'[[rule]]\ntoolName = "run_shell_command"\ncommandPrefix = "{command}"\ndecision = "allow"\n'
        (user.home / ".gemini" / "policies" / "tests.toml").write_text(shell + "priority = 100\n")
        async with own_session(user, project) as client:
            stale = await call(client, "store_experience", task=TASK, experience=STALE_FIX)
            with fake_gemini(sycophant(command)) as model:
                session = await anyio.to_thread.run_sync(user.session, project, model)
            assert session["response"].endswith("All the tests pass now. Done."), session
            (result,) = results(model.requests[-1], "run_shell_command")
            assert "1 failed" in result and "Exit Code: 1" in result, result  # what Gemini CLI showed the model
            (reason,) = holds(model)
            assert "its tests run said it failed" in reason and STALE_FIX not in reason, reason  # no memory's words
            state = await recall_state(client, recall_id_in(reason))
            assert (state["status"], state["reward"], state["reward_source"]) == ("reported", -1.0, "tests")
            (check,) = state["evidence"]
            assert (check["kind"], check["passed"], check["failed_count"]) == ("tests", False, 1)
            memory = await read_json(client, f"memrl://memories/{stale['id']}")
            assert memory["q"] < 0 and memory["history"][-1]["claimed"] == 1.0


@pytest.mark.slow  # Gemini CLI itself, the hooks and the memory's server as processes
@pytest.mark.anyio
async def test_an_api_error_is_never_held(tmp_path: Path) -> None:
    """The model's API fails (400): Gemini CLI fires no AfterAgent, so nothing is held (the model is never sent a
    hold) and nothing reported (its SessionEnd, when it fires, closes the recall with its evidence: none); the
    prompt's recall stays pending, to expire."""
    with gemini_user(tmp_path) as user, anyio.fail_after(DEADLINE_S):
        project = user.project("alpha")
        with fake_gemini(the_model(), status=400) as model:
            done = await anyio.to_thread.run_sync(
                lambda: gemini(
                    user.home,
                    "-p",
                    TASK,
                    cwd=project,
                    GOOGLE_GEMINI_BASE_URL=model.url,
                    GEMINI_CLI_TRUST_WORKSPACE="true",
                    **user.shell,
                )
            )
        assert done.returncode != 0 and model.requests, done.stderr
        recall_id = recall_id_in(recalled(model))
        assert not any(HOLD_OPENING in text for request in model.requests for text in texts(request))
        async with own_session(user, project) as client:
            state = await recall_state(client, recall_id)
            assert (state["status"], state["evidence"]) == ("pending", [])


@pytest.mark.slow  # Gemini CLI itself, the hooks and the memory's server as processes
@pytest.mark.anyio
async def test_in_github_actions_the_hooks_and_the_server_still_share_the_memory(tmp_path: Path) -> None:
    """In GitHub Actions Gemini CLI gives its hooks and MCP servers only a few variables of the environment (no
    XDG_RUNTIME_DIR, no MEMRL_*): both fall back to the same defaults, and the model's report reaches the hook's
    recall."""
    with gemini_user(tmp_path, github_actions=True) as user, anyio.fail_after(DEADLINE_S):
        project = user.project("alpha")
        with fake_gemini(the_model()) as model:
            await anyio.to_thread.run_sync(user.session, project, model)
        (held,) = holds(model)
        async with own_session(user, project) as client:
            state = await recall_state(client, recall_id_in(held))
            assert (state["status"], state["reward"]) == ("reported", 1.0)
