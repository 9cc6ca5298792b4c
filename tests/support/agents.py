"""The user of the tests that run the agents' own CLIs (Codex, Copilot CLI and Claude Code with the plugin of
integrations/claude-code installed, Gemini CLI with the extension of integrations/gemini-cli): one home folder (each
agent keeps its configuration there), a runtime folder as a login gives one (``XDG_RUNTIME_DIR``), the memory's
default store under the home, projects that are git repositories, and the environment every agent runs with: none
of the suite's settings (no ``MEMRL_*``), the installed ``memrl-mcp`` on the PATH. What each agent gives its hooks
and MCP server is then the agent's doing alone.

Each CLI is installed by ``make node`` from its folder's package.json and lock file (:func:`npm_cli`: ``npm ci``
when it is missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client

from memrl_mcp.clients.core import HOLD_OPENING
from tests.support.fake_api import Reply, Script
from tests.support.local import LocalStore, stop_all
from tests.support.mcp import read_json

ROOT = Path(__file__).parent.parent.parent
BIN = Path(sys.executable).parent  # where the install put memrl-mcp
INSTALL_S = 600
FOREIGN = ("MEMRL_", "XDG_", "CLAUDE", "ANTHROPIC_", "CODEX", "OPENAI_", "COPILOT", "GH_", "GITHUB_", "PLUGIN_",
           "GEMINI_", "GOOGLE_")  # fmt: skip
"""The variables of this process an agent must not see: the suite's settings, another agent's."""
HOLD = HOLD_OPENING
TASK = "deploy the web app to the staging cluster"
LEARNED = "run make migrate first, then make deploy ENV=staging and check /health"


def npm_cli(folder: str, binary: str) -> Path:
    """The CLI ``binary`` of tests/``folder`` (``make node``), installed from its lock file when it is missing."""
    found = ROOT / "tests" / folder / "node_modules" / ".bin" / binary
    if not found.exists():
        npm = shutil.which("npm")
        assert npm is not None, "npm is missing: `make node` (apt-get install -y nodejs npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=found.parents[2], check=True, timeout=INSTALL_S)
    return found


def agent_env(home: Path, **variables: str) -> dict[str, str]:
    """What the shell of a user whose home folder is ``home`` gives an agent it starts: this process's variables but
    the FOREIGN ones, the installed ``memrl-mcp`` first on the PATH; and ``variables``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(FOREIGN)}
    return env | {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env['PATH']}"} | variables


@dataclass(frozen=True)
class AgentUser:
    """One user of the agents (module docstring)."""

    home: Path
    runtime: Path

    @property
    def store(self) -> LocalStore:
        """The user's default store and the local server's folder in the runtime folder, for the test's own
        sessions (which name both, as the agents' never do)."""
        return LocalStore(self.home / ".local" / "share" / "memrl-mcp", self.runtime / "memrl-mcp")

    def env(self, **variables: str) -> dict[str, str]:
        """What the user's shell gives an agent it starts (its runtime folder too), and ``variables``."""
        return agent_env(self.home, XDG_RUNTIME_DIR=str(self.runtime), **variables)

    def project(self, name: str) -> Path:
        """A git repository of the user's, made on first use."""
        folder = self.home / "code" / name
        if not folder.exists():
            folder.mkdir(parents=True)
            subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=60)
        return folder

    def run(self, command: list[str], cwd: Path, timeout: float, **variables: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=cwd, env=self.env(**variables), capture_output=True, text=True, timeout=timeout, check=False
        )


@contextmanager
def agent_user(tmp_path: Path) -> Iterator[AgentUser]:
    """A user for one test: its home under ``tmp_path``, its runtime folder short (a socket's path is at most ~100
    bytes) and private; the local server stopped at the end, however it was started."""
    user = AgentUser(tmp_path / "home", Path(tempfile.mkdtemp(prefix="mrl", dir="/tmp")))
    user.home.mkdir()
    try:
        yield user
    finally:
        user.store.local("stop")
        stop_all(user.runtime, variable=f"XDG_RUNTIME_DIR={user.runtime}")
        stop_all(user.runtime / "memrl-mcp")
        shutil.rmtree(user.runtime, ignore_errors=True)


def recall_id_in(text: str) -> str:
    """The recall id a hold or a context names (its last)."""
    return text.rsplit('recall_id "', 1)[1].split('"', 1)[0]


def obliging_model(
    held: Callable[[dict[str, Any]], list[str]],
    called: Callable[[dict[str, Any], str], list[dict[str, Any]]],
    tools: str,
    recall_first: bool = False,
) -> Script:
    """A model that does what the hooks' words ask: it acts ("Done."), and reports the recall a held stop names,
    once, as a success; with ``recall_first``, it first recalls through the memory's MCP tool on its own. Of a
    request, ``held`` is the held stops' reasons it carries and ``called`` the arguments of each call the model made
    of a tool; ``tools`` is how the agent names the memory's tools (the prefix of their names)."""

    def reply(request: dict[str, Any]) -> Reply:
        holds = held(request)
        reported = {arguments["recall_id"] for arguments in called(request, f"{tools}report_outcome")}
        if holds and recall_id_in(holds[-1]) not in reported:
            arguments = {"recall_id": recall_id_in(holds[-1]), "reward": 1.0, "experience": LEARNED}
            return Reply(tool=f"{tools}report_outcome", arguments=arguments)
        if recall_first and not called(request, f"{tools}recall_experience"):
            return Reply(tool=f"{tools}recall_experience", arguments={"task": TASK})
        return Reply("Done.")

    return reply


async def recall_state(user: AgentUser, recall_id: str) -> dict[str, Any]:
    """The recall as the memory keeps it, read by a session of the test's own (no project: any recall)."""
    async with Client(user.store.session(), mode="legacy") as client:
        return await read_json(client, f"memrl://recalls/{recall_id}")
