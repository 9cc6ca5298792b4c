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
