"""Where memrl-mcp keeps things on this machine by default: the store's folder and the per-user runtime folder of the
local server's sockets and locks.

Kept apart from :mod:`memrl_mcp.settings` (which loads pydantic and builds every model, half a second) because the
stdio entry reads these before it decides whether it needs the settings at all: a session attaching to a running
server must start in a fraction of that.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import platformdirs

APP = "memrl-mcp"


def default_data_dir() -> Path:
    """The platform's user data folder (``~/.local/share/memrl-mcp`` on Linux): the ``data_dir`` setting's default."""
    return Path(platformdirs.user_data_dir(APP))


def default_runtime_dir() -> Path:
    """The per-user folder of the local servers (the ``runtime_dir`` setting's default): ``$XDG_RUNTIME_DIR/memrl-mcp``
    when the session has one (a tmpfs only this user can enter, emptied at logout), on macOS the user's own temporary
    folder (``$TMPDIR``, per user there), else ``memrl-mcp-<uid>`` in the temporary folder, which the attach path
    creates private (0700) and refuses when another user made it first."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / APP
    if sys.platform == "darwin":
        return Path(tempfile.gettempdir()) / APP
    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"
