"""The TypeScript MCP clients of the tests (tests/ts_client: the official SDK, the MCP Inspector and the node it runs
on), installed by ``make node``, or here from the lock file when missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[1] / "ts_client"
INSTALL_TIMEOUT_S = 600
PACKAGES = ("@modelcontextprotocol/sdk", "@modelcontextprotocol/inspector", "node")


def ts_clients() -> str:
    """Debian's node (the SDK's scripts run on it), after installing tests/ts_client's packages if one is missing
    (``npm ci``: the lock file's versions, nothing else); fails, saying what to do, without node or npm."""
    found = shutil.which("node")
    assert found is not None, "node is missing: `make node` (apt-get install -y nodejs npm)"
    if not all((CLIENTS / "node_modules" / package).is_dir() for package in PACKAGES):
        npm = shutil.which("npm")
        assert npm is not None, "npm is missing: `make node` (apt-get install -y nodejs npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENTS, check=True, timeout=INSTALL_TIMEOUT_S)
    return found


def inspector() -> list[str]:
    """The MCP Inspector's command line (its CLI needs node 22, which the packages bring)."""
    ts_clients()
    bin_folder = CLIENTS / "node_modules" / ".bin"
    return [str(bin_folder / "node"), str(bin_folder / "mcp-inspector")]
