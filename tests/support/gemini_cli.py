"""Gemini CLI as the tests run it (tests/gemini_cli, ``make node``): its model faked (:mod:`tests.support.gemini`),
the extension of integrations/gemini-cli installed by ``gemini extensions install`` as docs/gemini-cli.md says, one
headless session (``gemini -p``) at a time in a trusted folder; and the model the tests give it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from memrl_mcp.clients.core import HOLD_OPENING, RECALLED
from tests.support.agents import LEARNED, ROOT, TASK, agent_env, npm_cli, recall_id_in
from tests.support.anthropic import Reply, Script
from tests.support.gemini import FakeGemini, calls, texts

EXTENSION = ROOT / "integrations" / "gemini-cli"
TOOLS = "mcp_memrl_"  # how Gemini CLI names the memory's tools
SESSION_S = 180


def gemini(home: Path, *args: str, cwd: Path, answer: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``gemini ARGS`` as the user of home folder ``home`` runs it (:func:`agent_env`: without the suite's MEMRL_*
    variables, whose one process per session would keep the hooks from the local server, nor the machine's XDG_*
    folders), with ``env`` from their shell; ``answer`` on stdin."""
    variables = agent_env(home, GEMINI_API_KEY="any", **env)
    return subprocess.run(
        [str(npm_cli("gemini_cli", "gemini")), *args], cwd=cwd, env=variables, input=answer, capture_output=True,
        text=True, timeout=SESSION_S,
    )  # fmt: skip


def install_extension(home: Path) -> None:
    """The extension installed as docs/gemini-cli.md says: ``gemini extensions install`` from the checkout,
    answering its question to trust the folder, and the policy that lets the model report."""
    (home / ".gemini").mkdir(parents=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False},
                "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}}  # fmt: skip
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    checked = gemini(home, "extensions", "validate", str(EXTENSION), cwd=home)
    assert checked.returncode == 0 and "successfully validated" in checked.stdout + checked.stderr, checked.stderr
    installed = gemini(home, "extensions", "install", str(EXTENSION), "--consent", cwd=home, answer="y\n")
    said = installed.stdout + installed.stderr
    assert installed.returncode == 0 and "Do you want to trust this folder" in said, said
    assert 'Extension "memrl" installed successfully and enabled.' in said, said
    trusted = json.loads((home / ".gemini" / "trustedFolders.json").read_text())
    assert trusted[str(EXTENSION)] == "TRUST_FOLDER", trusted
    (home / ".gemini" / "policies").mkdir()
    shutil.copy(EXTENSION / "allow-memory.toml", home / ".gemini" / "policies" / "memrl.toml")


def session(home: Path, project: Path, model: FakeGemini, *args: str, **shell: str) -> dict[str, Any]:
    """``gemini -p TASK`` in ``project``, trusted (as headless runs are: GEMINI_CLI_TRUST_WORKSPACE), with the
    variables of the user's ``shell``: its JSON output."""
    done = gemini(home, "-p", TASK, "--output-format", "json", *args, cwd=project, GOOGLE_GEMINI_BASE_URL=model.url,
                  GEMINI_CLI_TRUST_WORKSPACE="true", **shell)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def holds(model: FakeGemini) -> list[str]:
    """The held stops' reasons the model received in the whole session: each a prompt of its own."""
    return [text for text in texts(model.requests[-1]) if text.startswith(HOLD_OPENING)]


def the_model(recall_first: bool = False) -> Script:
    """A model that does what the hooks' words ask: it acts ("Done."), and reports the recall a held stop names,
    once; with ``recall_first``, it first recalls through the memory's MCP tool on its own."""

    def reply(request: dict[str, Any]) -> Reply:
        held = [text for text in texts(request) if text.startswith(HOLD_OPENING)]
        reported = {arguments["recall_id"] for arguments in calls(request, f"{TOOLS}report_outcome")}
        if held and recall_id_in(held[-1]) not in reported:
            arguments = {"recall_id": recall_id_in(held[-1]), "reward": 1.0, "experience": LEARNED}
            return Reply(tool=f"{TOOLS}report_outcome", arguments=arguments)
        if recall_first and not calls(request, f"{TOOLS}recall_experience"):
            return Reply(tool=f"{TOOLS}recall_experience", arguments={"task": TASK})
        return Reply("Done.")

    return reply


def recalled(model: FakeGemini) -> str:
    """The hook's context of the session's prompt; that the hook recalled for it alone (not for its hold)."""
    (context,) = [text for text in texts(model.requests[-1]) if RECALLED in text]
    assert context.startswith(f"<hook_context>{RECALLED}"), context
    return context
