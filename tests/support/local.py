"""Stores served by the local memory server in tests: a runtime folder of the test's own (so no server is shared
between tests), sessions spawned as a client spawns them, and the server found, stopped and cleaned up."""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        return self.target_with()

    def target_with(self, **variables: str) -> Target:
        """What a session with the test's ``variables`` attaches to."""
        found = target_of(environ=self.env(**variables), cwd=self.data_dir.parent)
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


def proc_status(pid: int) -> dict[str, int]:
    """The counts of ``/proc/PID/status``: ``VmRSS`` and ``VmHWM`` (the peak of VmRSS) in kB, ``Threads``..."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.split() and value.split()[0].isdigit():
            fields[name] = int(value.split()[0])
    return fields


class Wire:
    """A session of the local server driven line by line, as a runaway or hostile client drives it: a greeted
    connection, the MCP handshake made; requests written as they are given, answers read by id."""

    def __init__(self, store: LocalStore, **variables: str) -> None:
        self.connection = attach(store.target_with(**variables)).connection
        self._reader = self.connection.makefile("rb")
        self._ids = itertools.count(1)
        self._answers: dict[Any, dict[str, Any]] = {}
        info = {"name": "wire", "version": "1"}
        self.answer(self.send("initialize", protocolVersion="2025-11-25", capabilities={}, clientInfo=info))
        self.connection.sendall(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')

    def send(self, method: str, **params: Any) -> int:
        """Write one request; its id."""
        request_id = next(self._ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        self.connection.sendall(json.dumps(message).encode() + b"\n")
        return request_id

    def call(self, tool: str, **arguments: Any) -> int:
        return self.send("tools/call", name=tool, arguments=arguments)

    def send_bytes(self, pieces: Iterable[bytes]) -> None:
        for piece in pieces:
            self.connection.sendall(piece)

    def next(self) -> dict[str, Any]:
        """The next message the server wrote."""
        line = self._reader.readline()
        assert line, "the server closed the connection"
        message: dict[str, Any] = json.loads(line)
        return message

    def answer(self, request_id: Any) -> dict[str, Any]:
        """The answer to ``request_id`` (those of others read meanwhile are kept for later)."""
        while request_id not in self._answers:
            message = self.next()
            if "method" not in message:
                self._answers[message.get("id")] = message
        return self._answers.pop(request_id)

    def result(self, request_id: Any) -> dict[str, Any]:
        """The structured result of a tool call that must succeed."""
        answer = self.answer(request_id)
        assert "result" in answer and not answer["result"].get("isError"), answer
        structured: dict[str, Any] = answer["result"]["structuredContent"]
        return structured

    def close(self) -> None:
        self._reader.close()
        self.connection.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def servers_of(runtime_dir: Path) -> list[int]:
    """The pids of the local servers running with this runtime folder (each is ``memrl-mcp local run``)."""
    return servers_with(f"MEMRL_RUNTIME_DIR={runtime_dir}")


def servers_with(variable: str) -> list[int]:
    """The pids of the local servers whose environment holds ``variable`` (``NAME=value``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"local" in command and b"run" in command and variable.encode() in environ:
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


def stop_all(runtime_dir: Path, variable: str | None = None) -> None:
    """SIGKILL every local server of this runtime folder (or whose environment holds ``variable``)."""
    variable = variable or f"MEMRL_RUNTIME_DIR={runtime_dir}"
    for pid in servers_with(variable):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + GONE_S
    while servers_with(variable) and time.monotonic() < deadline:
        time.sleep(0.05)


class RawSession:
    """``memrl-mcp`` over stdio driven line by line, as a client of any kind would (its messages as JSON lines, what
    it reads taken as it comes), so that a test chooses the moment of each message: a late answer, a kill between
    two lines."""

    def __init__(self, store: LocalStore, **variables: str) -> None:
        self._process = subprocess.Popen(
            CLI,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=store.env(**variables),
            cwd=store.data_dir.parent,
        )
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []  # every message read, in order
        self._ids = itertools.count(1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        self._process.stdin.flush()

    def initialize(self, **capabilities: Any) -> None:
        info = {"name": "raw", "version": "1"}
        params = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": info}
        self.request("initialize", params)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def ask(self, request_id: int, method: str, params: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})

    def request(self, method: str, params: dict[str, Any], timeout: float = 240) -> dict[str, Any]:
        """Send a request and wait for its answer (what else arrives meanwhile is kept in :attr:`seen`)."""
        request_id = next(self._ids)
        self.ask(request_id, method, params)
        return self.wait(lambda message: message.get("id") == request_id and "method" not in message, timeout)

    def call(self, tool: str, timeout: float = 240, **arguments: Any) -> dict[str, Any]:
        return self.request("tools/call", {"name": tool, "arguments": arguments}, timeout)

    def wait(self, wanted: Callable[[dict[str, Any]], bool], timeout: float = 240) -> dict[str, Any]:
        """The first message read, from the start of the session, that is ``wanted``."""
        for message in self.seen:
            if wanted(message):
                return message
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no such message in {timeout:g} s; read: {self.seen}"
            try:
                message = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(message)
            if wanted(message):
                return message

    def close(self) -> str:
        """Close stdin, wait for the end; what the session said on stderr."""
        assert self._process.stdin is not None and self._process.stderr is not None
        self._process.stdin.close()
        self._process.wait(timeout=120)
        return self._process.stderr.read().decode()


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
