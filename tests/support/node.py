"""The TypeScript SDK's MCP client (npm @modelcontextprotocol/sdk, pinned in tests/ts_client/): node, and the SDK
installed from the lock file when it is missing (``make node`` installs both)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CLIENT = Path(__file__).parent.parent / "ts_client"
INSTALL_S = 300


def node_with_sdk() -> str:
    """The ``node`` command, once the SDK is installed (``npm ci``: the lock file's versions); fails without node."""
    found = shutil.which("node")
    assert found is not None, "node is missing: `make node` (apt-get install -y nodejs npm)"
    if not (CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        npm = shutil.which("npm")
        assert npm is not None, "npm is missing: `make node` (apt-get install -y nodejs npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True, timeout=INSTALL_S)
    return found


INSPECTOR_PACKAGES = ("@modelcontextprotocol/inspector", "node")  # the Inspector, and the node 22 its CLI needs


def inspector() -> list[str]:
    """The MCP Inspector's command line (npm @modelcontextprotocol/inspector and node 22, pinned in tests/ts_client/:
    Debian's node is 20), installed from the lock file when missing as the SDK is."""
    node_with_sdk()
    if not all((CLIENT / "node_modules" / package).is_dir() for package in INSPECTOR_PACKAGES):
        npm = shutil.which("npm")
        assert npm is not None, "npm is missing: `make node` (apt-get install -y nodejs npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True, timeout=INSTALL_S)
    bin_folder = CLIENT / "node_modules" / ".bin"
    return [str(bin_folder / "node"), str(bin_folder / "mcp-inspector")]
