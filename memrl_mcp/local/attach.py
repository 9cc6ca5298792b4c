"""The attaching side of the local server's rendezvous: which store a session means, reaching its server or starting
one, and greeting it.

:func:`target_of` says which store's server a session attaches to, or that it runs its own process (``attach``
off, a ``read_only`` profile, a Qdrant server). It reads the settings without loading them when nothing but the
environment's store and runtime folder can matter (no config file, no variable that decides whether to attach):
loading them costs half a second, most of an attach. The server then loads the session's settings itself and
refuses a session whose store is not its own, so this shortcut can never attach a session to another store.

:func:`attach` connects to the store's server (its socket in :mod:`memrl_mcp.local.place`, reached through the
folder's checked descriptor), makes sure that the kernel says this user listens there (another user's socket is
refused before a byte is sent), and greets it (:mod:`memrl_mcp.local.greeting`) with the session's settings: its
store, config file and working folder, and of its environment only the variables the settings read
(:func:`~memrl_mcp.variables.read_by_settings`), never the rest (tokens, keys). When none runs, it starts one
(``memrl-mcp local run``, in a session of its own so that it outlives its starter) and waits for it. Sessions
starting at the same moment start one server: the first takes ``start.lock`` and holds it until its server holds
``owner.lock``; the others wait for the socket. A server that cannot start (its store held by a process of its own,
bad settings) is reported with the end of its log. Everything, the greeting too, keeps to the caller's ``timeout``:
a server that is stopped (SIGSTOP) or answers a byte at a time holds nobody past it.

For hooks and scripts that must reach the memory in well under a second, :func:`connect` returns a greeted
connection (newline-delimited JSON-RPC, as over stdio), over which :class:`~memrl_mcp.local.client.LocalClient`
makes MCP calls. The standard library only: the attaching side starts in tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import memrl_mcp
from memrl_mcp import __version__
from memrl_mcp.folders import default_data_dir
from memrl_mcp.local.greeting import Answer, Hello, Kind, decode, encode, read_line
from memrl_mcp.local.place import (
    LOG,
    SOCKET,
    START_LOCK,
    AttachError,
    Place,
    build_identity,
    flocked,
    owner_running,
    peer_uid,
    place_of,
)
from memrl_mcp.variables import read_by_settings

START_SECONDS = 120.0  # a cold start loads the model and opens the store: seconds, more on a loaded machine
GREETING_SECONDS = 30.0  # a running server answers a greeting in milliseconds; a stopped (SIGSTOP) one never does
POLL_SECONDS = 0.02
DECIDING_VARIABLES = ("MEMRL_CONFIG", "MEMRL_ATTACH", "MEMRL_QDRANT_URL", "QDRANT_URL")
"""Variables that may change the store or whether to attach at all: with any of them, the settings are loaded."""


class NotRunningError(AttachError):
    """No local server runs for the store, and none was to be started."""


@dataclass(frozen=True)
class Target:
    """A session's store, and the inputs its settings come from: what it attaches to, and how the server it may
    start reads the same settings (its environment and config file, from its working folder)."""

    data_dir: Path
    runtime_dir: Path | None
    cwd: Path
    config: Path | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    check_commands: tuple[str, ...] = ()  # a project's own checks, which the hooks recognise (check_commands)

    def hello(self, kind: Kind, host: str = "", port: int = 0) -> Hello:
        return Hello(
            kind=kind,
            version=__version__,
            build=build_identity(),
            pid=os.getpid(),
            data_dir=str(self.data_dir),
            config=None if self.config is None else str(self.config),
            cwd=str(self.cwd),
            environ=read_by_settings(self.environ),
            host=host,
            port=port,
        )


def target_of(
    data_dir: str | Path | None = None,
    config: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Target | None:
    """The local server a session with these inputs attaches to (the ``--data-dir`` and ``--config`` options, the
    environment, default ``os.environ``, and the working folder); None when it runs its own process. A bad setting
    raises the settings' own error."""
    environ = dict(os.environ if environ is None else environ)
    cwd = Path(os.path.abspath(cwd or os.getcwd()))
    checks = _check_commands(environ.get("MEMRL_CHECK_COMMANDS", "[]"))
    if config is None and checks is not None and not any(name in environ for name in DECIDING_VARIABLES):
        if environ.get("MEMRL_TOOL_PROFILE") == "read_only":
            return None
        store = data_dir or environ.get("MEMRL_DATA_DIR") or default_data_dir()
        runtime = environ.get("MEMRL_RUNTIME_DIR")
        return Target(cwd / store, cwd / runtime if runtime else None, cwd, None, environ, checks)
    from memrl_mcp.settings import load_settings  # the slow path (module docstring)

    given = {} if data_dir is None else {"data_dir": data_dir}
    settings = load_settings(config, environ, relative_to=cwd, **given)
    serving = settings.serving
    if not serving.attach or serving.read_only or settings.storage.qdrant_url is not None:
        return None
    file = config or environ.get("MEMRL_CONFIG")
    where = cwd / file if file else None
    return Target(settings.storage.data_dir, serving.runtime_dir, cwd, where, environ, tuple(serving.check_commands))


def _check_commands(text: str) -> tuple[str, ...] | None:
    """``MEMRL_CHECK_COMMANDS`` as the settings read it (a JSON list of strings); None when it is not one, for the
    settings to say why."""
    try:
        commands = json.loads(text)
    except ValueError:
        return None
    if not isinstance(commands, list) or not all(isinstance(command, str) for command in commands):
        return None
    return tuple(commands)


@dataclass
class Attached:
    """A greeted connection to a store's local server, and the server this side started, if it did."""

    connection: socket.socket
    answer: Answer
    started: subprocess.Popen[bytes] | None = None


def attach(
    target: Target,
    kind: Kind = "session",
    start: bool = True,
    timeout: float = START_SECONDS,
    http: tuple[str, int] = ("", 0),
) -> Attached:
    """A connection to ``target``'s local server, greeted as ``kind`` (``http``: serve streamable HTTP on the host
    and port ``http`` while the connection is open), within ``timeout`` seconds in all; the server
    is started first when none runs and ``start`` (module docstring). :class:`NotRunningError` when none runs and
    none is to be started; :class:`AttachError` when none could be reached or started in time, another user
    listens, or the server refused (its message says why)."""
    place = place_of(target.data_dir, target.runtime_dir)
    hello = target.hello(kind, *http)
    deadline = time.monotonic() + timeout
    started: subprocess.Popen[bytes] | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AttachError(
                f"no local memory server answered for {target.data_dir} within {timeout:g} s (its log: {place.log})"
            )
        connection = connect_socket(place, min(GREETING_SECONDS, left))
        if connection is not None:
            try:
                answer = greet(connection, hello, time.monotonic() + min(GREETING_SECONDS, left))
            except TimeoutError:
                connection.close()
                raise AttachError(
                    f"the local memory server at {place.socket} did not answer in time (within "
                    f"{min(GREETING_SECONDS, left):.3g} s): it may be stopped or overloaded"
                ) from None
            except ValueError as error:
                connection.close()
                raise AttachError(f"the local memory server at {place.socket} did not greet ({error})") from None
            if answer is not None and answer.ok:
                return Attached(connection, answer, started)
            connection.close()
            if answer is not None and not answer.retry:
                raise AttachError(answer.message)
        elif not start:
            raise NotRunningError(f"no local memory server runs for {target.data_dir}")
        elif started is None or started.poll() is not None:
            if started is not None and started.returncode != 0:
                raise AttachError(_failure(place, started.returncode))
            started = _start(place, target, deadline) or started
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))


def _start(place: Place, target: Target, deadline: float) -> subprocess.Popen[bytes] | None:
    """A new server for ``place``, holding ``start.lock`` until it holds ``owner.lock`` (or ends); None when another
    session is starting one or one runs (then it is the one to wait for)."""
    with flocked(place, START_LOCK) as mine:
        if not mine or owner_running(place):
            return None
        # The server runs this very code (the build it greets with is this one's): ``-P`` keeps the working folder
        # off its path, and this package's folder goes first on it.
        command = [sys.executable, "-P", "-m", "memrl_mcp.cli", "local", "run", "--data-dir", str(target.data_dir)]
        if target.config is not None:
            command += ["--config", str(target.config)]
        environ = dict(target.environ)
        code = str(Path(memrl_mcp.__file__).resolve().parent.parent)
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [code, environ.get("PYTHONPATH")]))
        cwd = target.cwd if target.cwd.is_dir() else Path("/")
        with place.opened() as folder:
            log_fd = folder.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with open(log_fd, "wb") as log:
            server = subprocess.Popen(
                command,
                env=environ,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # outlives its starter, and a signal to the starter's group misses it
            )
        while server.poll() is None and not owner_running(place) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        return server


def _failure(place: Place, status: int) -> str:
    try:
        with place.opened() as folder, open(folder.open(LOG, os.O_RDONLY), errors="replace") as log:
            tail = log.read().strip().splitlines()[-5:]
    except (OSError, AttachError):
        tail = []
    said = " ".join(line.strip() for line in tail) or "nothing"
    return f"the local memory server could not start (exit status {status}); its log ({place.log}) says: {said}"


def connect(data_dir: str | Path | None = None, *, start: bool = True, timeout: float = START_SECONDS) -> socket.socket:
    """A connection to the local memory server of the store at ``data_dir`` (default: the store this process's
    environment and settings name, as ``memrl-mcp`` would use), started first when none runs and ``start``.

    The connection is greeted and blocking: what follows is one MCP session, newline-delimited JSON-RPC exactly as
    over a stdio server's pipes, starting with the client's ``initialize``; closing the socket ends the session.
    Wrap it with :class:`~memrl_mcp.local.client.LocalClient`, or hand it to any MCP client that speaks stdio's
    framing. Raises :class:`NotRunningError` when none runs and ``start`` is false, and :class:`AttachError` (the
    message says why) when the settings do not attach (``attach: false``, ``read_only``, a Qdrant server), or no
    server could be reached, started or used."""
    target = target_of(data_dir)
    if target is None:
        raise AttachError("these settings run memrl-mcp in a process of its own (attach: false, read_only, qdrant_url)")
    return attach(target, start=start, timeout=timeout).connection


def connect_socket(place: Place, timeout: float) -> socket.socket | None:
    """A connection to the server's socket in ``place``, through the folder's checked descriptor; None when nothing
    listens there (no file, or one a dead server left). :class:`AttachError` when another user listens: nothing was
    sent (module docstring)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(timeout)
    try:
        with place.opened() as folder:
            connection.connect(folder.through(SOCKET))
    except (FileNotFoundError, ConnectionRefusedError):
        connection.close()
        return None
    except BaseException:
        connection.close()
        raise
    uid = peer_uid(connection)
    if uid != os.getuid():
        connection.close()
        who = "a process the kernel does not name" if uid is None else f"another user (uid {uid})"
        raise AttachError(
            f"the local memory server's socket {place.socket} is held by {who}, who could be listening to catch "
            f"this session: nothing was sent to it. Remove {place.folder}, and keep the runtime folder "
            f"{place.folder.parent} and the folders above it writable by you alone (or set runtime_dir, "
            "MEMRL_RUNTIME_DIR, to such a folder of your own)"
        )
    return connection


def greet(connection: socket.socket, hello: Hello, deadline: float) -> Answer | None:
    """Send ``hello`` and read the server's answer, all of it by ``deadline`` (``time.monotonic()``; TimeoutError
    else); None when the server closed first (it is going away)."""
    try:
        connection.sendall(encode(hello))
        return decode(Answer, read_line(connection, deadline=deadline))
    except (ConnectionError, BrokenPipeError):
        return None
