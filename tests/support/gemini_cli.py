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
from tests.support.agents import ROOT, TASK, agent_env, npm_cli, obliging_model
from tests.support.fake_api import Script
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
    return held_in(model.requests[-1])


def held_in(request: dict[str, Any]) -> list[str]:
    """The held stops' reasons a request carries (Gemini CLI sends each as a prompt of its own)."""
    return [text for text in texts(request) if text.startswith(HOLD_OPENING)]


def the_model(recall_first: bool = False) -> Script:
    """The model that does what the hooks' words ask (:func:`~tests.support.agents.obliging_model`)."""
    return obliging_model(held_in, calls, TOOLS, recall_first)


def recalled(model: FakeGemini) -> str:
    """The hook's context of the session's prompt; that the hook recalled for it alone (not for its hold)."""
    (context,) = [text for text in texts(model.requests[-1]) if RECALLED in text]
    assert context.startswith(f"<hook_context>{RECALLED}"), context
    return context
