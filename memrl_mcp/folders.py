"""Where memrl-mcp keeps things on this machine by default: the store's folder and the per-user runtime folder of the
local server's sockets and locks.

Kept apart from :mod:`memrl_mcp.settings` (which loads pydantic and builds every model, half a second) because the
stdio entry reads these before it decides whether it needs the settings at all: a session attaching to a running
server must start in a fraction of that.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

import platformdirs

APP = "memrl-mcp"
LOGIN_RUNTIME = Path("/run/user")  # where systemd-logind makes each logged-in user's XDG_RUNTIME_DIR


def default_data_dir() -> Path:
    """The platform's user data folder (``~/.local/share/memrl-mcp`` on Linux): the ``data_dir`` setting's default."""
    return Path(platformdirs.user_data_dir(APP))


def default_runtime_dir() -> Path:
    """The per-user folder of the local servers (the ``runtime_dir`` setting's default): ``$XDG_RUNTIME_DIR/memrl-mcp``
    when the session has one (a tmpfs only this user can enter, emptied at logout); else, on Linux, the folder
    ``XDG_RUNTIME_DIR`` names in this user's sessions, ``/run/user/<uid>``, when it is this user's alone
    (:func:`login_runtime_dir`); on macOS the user's own temporary folder (``$TMPDIR``, per user there); else
    ``memrl-mcp-<uid>`` in the temporary folder, which the attach path creates private (0700) and refuses when another
    user made it first.

    Why ``/run/user/<uid>`` without the variable: an agent may start the memory's MCP server with a filtered
    environment (Codex passes its MCP servers no ``XDG_RUNTIME_DIR``) while its hooks have the user's: both must meet
    the same local server, or the second to start finds the store held by the first's."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / APP
    if sys.platform == "darwin":
        return Path(tempfile.gettempdir()) / APP
    login = login_runtime_dir()
    if login is not None:
        return login / APP
    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"


def login_runtime_dir() -> Path | None:
    """``/run/user/<uid>`` when it is this user's runtime folder as the XDG specification has it: a folder (not a
    link), owned by this user, that no one else may enter; None otherwise (another user who made it could list, swap
    or catch what goes in it)."""
    folder = LOGIN_RUNTIME / str(os.getuid())
    try:
        found = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return folder
