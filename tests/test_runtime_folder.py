"""The default runtime folder (memrl_mcp/folders.py) as a user of its own sees it (a uid made for the test, run with
``setpriv``): a process started without ``XDG_RUNTIME_DIR`` (Codex starts its MCP servers so) takes the runtime
folder of one that has it, ``/run/user/<uid>``; and a ``/run/user/<uid>`` that is not that user's alone
(another user made it, it lets others in, it is a link) is never taken."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memrl_mcp.folders import APP, LOGIN_RUNTIME

DEFAULT = "from memrl_mcp.folders import default_runtime_dir; print(default_runtime_dir())"


@pytest.fixture
def uid() -> int:
    """A user id nobody on this machine has: no account, no login folder, no earlier runtime folder."""
    while True:
        found = random.randrange(40_000, 60_000)
        taken = (LOGIN_RUNTIME / str(found)).exists() or Path(tempfile.gettempdir(), f"{APP}-{found}").exists()
        if not taken and subprocess.run(["getent", "passwd", str(found)], capture_output=True).returncode:
            return found


@pytest.fixture
def login(uid: int) -> Iterator[Path]:
    """``/run/user/<uid>`` as systemd-logind makes it at a login: the user's, 0700; removed at the end."""
    folder = LOGIN_RUNTIME / str(uid)
    folder.mkdir(mode=0o700)
    os.chown(folder, uid, uid)
    try:
        yield folder
    finally:
        if folder.is_symlink():
            folder.unlink()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(Path(tempfile.gettempdir(), f"{APP}-{uid}"), ignore_errors=True)


def run_as(uid: int, command: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``command`` as that user, with ``env`` and nothing else of this process's (no MEMRL_*, no XDG_*)."""
    user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    return subprocess.run(
        [*user, *command], env=base | env, cwd="/", capture_output=True, text=True, timeout=timeout, check=False
    )


def default_as(uid: int, **env: str) -> str:
    done = run_as(uid, [sys.executable, "-c", DEFAULT], env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow  # processes of another user
def test_a_process_without_xdg_runtime_dir_takes_the_runtime_folder_of_one_with_it(uid: int, login: Path) -> None:
    """The user's hooks have ``XDG_RUNTIME_DIR=/run/user/<uid>``, the MCP server Codex starts has none: both take
    ``/run/user/<uid>/memrl-mcp`` (before, the second took ``/tmp/memrl-mcp-<uid>``, started a server of its own
    there, and found the store held by the first's: tests/test_codex.py runs Codex itself)."""
    assert default_as(uid, XDG_RUNTIME_DIR=str(login)) == default_as(uid) == str(login / APP)


@pytest.mark.slow  # processes of another user
def test_a_login_folder_that_is_not_the_users_alone_is_never_taken(uid: int, login: Path, tmp_path: Path) -> None:
    """Someone else's ``/run/user/<uid>`` (made by another user before the login), one open to others, and a link put
    in its place: the default stays the private folder of the temporary folder, which the attach path checks."""
    fallback = str(Path(tempfile.gettempdir(), f"{APP}-{uid}"))
    os.chown(login, 0, 0)  # another user's (root's: as if made before the user's login)
    assert default_as(uid) == fallback
    os.chown(login, uid, uid)
    login.chmod(0o755)
    assert default_as(uid) == fallback
    login.chmod(0o700)
    assert default_as(uid) == str(login / APP)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, uid, uid)
    login.rmdir()
    login.symlink_to(theirs)
    assert default_as(uid) == fallback
