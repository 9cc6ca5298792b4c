"""Stores served by the local memory server in tests: a runtime folder of the test's own (so no server is shared
between tests), sessions spawned as a client spawns them, and the server found, stopped and cleaned up."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mcp import StdioServerParameters

from memrl_mcp.local.attach import NotRunningError, Target, attach, target_of
from memrl_mcp.local.greeting import Answer
from memrl_mcp.local.place import Place, owner_running, place_of
from tests.support.servers import CLI, EVERY_TOOL, ONE_PROCESS, child_env

GONE_S = 30.0  # a stopped server releases its store within seconds


@dataclass(frozen=True)
class LocalStore:
    """A store, and the runtime folder its local server lives in for this test."""

    data_dir: Path
    runtime_dir: Path

    def env(self, **variables: str) -> dict[str, str]:
        """A session's environment: the attach default (not the suite's one process per session), every tool, this
        store and this runtime folder, and the test's own variables."""
        env = child_env(self.data_dir, MEMRL_RUNTIME_DIR=str(self.runtime_dir), **EVERY_TOOL)
        return {name: value for name, value in env.items() if name not in ONE_PROCESS} | variables

    def session(self, *args: str, **variables: str) -> StdioServerParameters:
        """``memrl-mcp`` over stdio as an MCP client starts it."""
        env, cwd = self.env(**variables), self.data_dir.parent  # not the checkout: python -m imports from there
        return StdioServerParameters(command=CLI[0], args=[*CLI[1:], *args], env=env, cwd=cwd)

    @property
    def target(self) -> Target:
        found = target_of(environ=self.env())
        assert found is not None
        return found

    @property
    def place(self) -> Place:
        return place_of(self.data_dir, self.runtime_dir)

    def status(self) -> Answer | None:
        """What the running server says of itself; None when none runs."""
        try:
            attached = attach(self.target, "status", start=False)
        except NotRunningError:
            return None
        attached.connection.close()
        return attached.answer

    def server_pid(self) -> int:
        answer = self.status()
        assert answer is not None, "no local server runs"
        return answer.pid

    def wait_gone(self, timeout: float = GONE_S) -> None:
        """Until no server holds the store (it may be stopping)."""
        deadline = time.monotonic() + timeout
        while owner_running(self.place):
            assert time.monotonic() < deadline, f"the local server of {self.data_dir} is still running"
            time.sleep(0.05)

    def local(self, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
        """``memrl-mcp local ...`` for this store."""
        return subprocess.run(
            [*CLI, "local", *args],
            env=self.env(**variables),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )


def servers_of(runtime_dir: Path, variable: str = "MEMRL_RUNTIME_DIR") -> list[int]:
    """The pids of the local servers running with this runtime folder (each is ``memrl-mcp local run``), named by
    ``variable`` in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"local" in command and b"run" in command and f"{variable}={runtime_dir}".encode() in environ:
            found.append(int(entry.name))
    return found


@contextmanager
def local_store(tmp_path: Path, name: str = "data") -> Iterator[LocalStore]:
    """A fresh store under ``tmp_path`` and a runtime folder of its own (short: a socket's path is at most ~100
    bytes); every server still running in it is killed at the end, and the folder removed."""
    runtime = Path(tempfile.mkdtemp(prefix="mrl", dir="/tmp"))
    try:
        yield LocalStore(tmp_path / name, runtime)
    finally:
        stop_all(runtime)
        shutil.rmtree(runtime, ignore_errors=True)


def stop_all(runtime_dir: Path, variable: str = "MEMRL_RUNTIME_DIR") -> None:
    for pid in servers_of(runtime_dir, variable):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + GONE_S
    while servers_of(runtime_dir, variable) and time.monotonic() < deadline:
        time.sleep(0.05)


def python_with(code: str, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``args`` in a fresh Python process with ``env``, out of the checkout (``-c`` would import the
    package from the working folder)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=tempfile.gettempdir(),
    )
