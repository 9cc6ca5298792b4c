"""The local memory server: one process per user and store, which owns the store and serves every session attached
to it (``memrl-mcp`` over stdio, :mod:`memrl_mcp.local.relay`; hooks and scripts, :mod:`memrl_mcp.local.attach`),
started by the first of them and gone after ``local_idle_seconds`` without any.

Each session is a connection to the server's Unix socket (:mod:`memrl_mcp.local.place`), served exactly as a
stdio server serves its one client: an MCP session (of the server :func:`~memrl_mcp.surface.server.create_server`
builds with ``single_client`` for the sessions with its settings) over the same stream machinery
(:func:`~memrl_mcp.transports.stdio.socket_streams`), on an event loop of its own in a thread of its own, so what one
session waits for (the store's write lock on the loop, a question to its user) holds back no other. All of them
share one :class:`~memrl_mcp.memory.service.MemoryService`, which is safe for concurrent callers. Per session: its
roots (project namespace), its questions to its client, its protocol era, and its own settings among ``namespace``,
``namespace_from_roots``, ``project_dir``, ``tool_profile`` and ``tool_descriptions``.

Who may connect: only this user. The socket lives in a folder only this user can enter and is itself 0600 (bound
through the folder's checked descriptor, :mod:`memrl_mcp.local.place`); on top, the kernel's record of the
connecting process's user (``SO_PEERCRED``, ``LOCAL_PEERCRED``) must be this user's, or the connection is closed
unread. The inspector (``/ui``) is served on a loopback port chosen at start, behind a
bearer token made at start and told only over the socket (``memrl-mcp local ui``); every other route but
``/health`` needs that token too, and the HTTP transport's host and origin checks apply as on any HTTP server.

A session is admitted only when the server can serve it as a process of its own would:

- the same code (:func:`~memrl_mcp.local.place.build_identity`): another version of memrl-mcp meeting a server
  that serves no session makes it stop, and a new one starts for it; one that serves sessions is refused with the
  reason (the store is never written by two versions at once);
- the same memory: the session's settings of the groups that shape the memory (:data:`MEMORY_GROUPS`) must be the
  server's; else the same as above (a restart when nobody else is served, a refusal naming the settings when
  somebody is).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from pathlib import Path

import anyio
import uvicorn
from mcp.server import MCPServer

from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError
from memrl_mcp.local.greeting import Answer, Hello, decode, encode, read_line
from memrl_mcp.local.place import OWNER_LOCK, SOCKET, AttachError, Place, build_identity, flocked, peer_uid, place_of
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import ALL_NAMESPACES, Settings, SettingsError, TokenGrant, load_settings
from memrl_mcp.surface.auth import TokenTable
from memrl_mcp.surface.server import create_server
from memrl_mcp.transports.http import UVICORN_OPTIONS, http_app
from memrl_mcp.transports.stdio import run_session, socket_streams

GREETING_SECONDS = 10.0  # a session greets at once; a connection that does not is dropped
STOP_SECONDS = 10.0  # how long a stop waits for the sessions to answer the requests they read
MEMORY_GROUPS = ("storage", "embeddings", "similarity", "retrieval", "learning", "steps", "limits")
"""The groups of settings that shape the memory itself: every session of a server has the server's."""
SESSION_SETTINGS = (
    "namespace",
    "namespace_from_roots",
    "project_dir",
    "other_namespaces",
    "tool_profile",
    "tool_descriptions",
    "max_recall_chars",
)
"""The settings each session has its own of: what its MCP server offers, and its default namespace."""
LOOPBACK = "127.0.0.1"
log = logging.getLogger(__name__)


def run(settings: Settings) -> int:
    """``memrl-mcp local run``: own the store of ``settings`` and serve its sessions until idle or stopped; 0 also
    when another server owns the store already (the caller then attaches to that one), 2 when the store cannot be
    opened (the message is on stderr)."""
    place = place_of(settings.storage.data_dir, settings.serving.runtime_dir)
    with flocked(place, OWNER_LOCK) as mine:
        if not mine:
            log.info("another local server owns %s", settings.storage.data_dir)
            return 0
        os.umask(0o077)  # the socket, the log and anything else made from here on: this user's alone
        try:
            service = MemoryService.open(settings, read_only=False)
        except MemrlError as error:
            print(f"memrl-mcp: {error}", flush=True)  # stdout and stderr are the log that the starter reports
            return 2
        try:
            LocalServer(settings, place, service).serve()
        finally:
            service.close()
    return 0


class LocalServer:
    """The sessions of one store (module docstring)."""

    def __init__(self, settings: Settings, place: Place, service: MemoryService) -> None:
        self._settings, self._place, self._service = settings, place, service
        self._build = build_identity()
        self._started = time.time()
        self._lock = threading.Lock()
        self._building = threading.Lock()
        self._sessions: set[socket.socket] = set()  # admitted sessions, each a connection
        self._idle_since = time.monotonic()
        self._stopping = ""  # why the server stops, once it does
        self._wake_read, self._wake_write = os.pipe()
        self._inspector = Inspector(service)
        self._bound = 0  # the inode of the socket file this server bound
        self._servers: dict[str, MCPServer] = {}  # by the sessions' own settings (_server_for)

    def serve(self) -> None:
        """Accept sessions until idle, stopped or interrupted; then let the sessions finish and stop."""
        listener = self._listen()
        self._inspector.start()
        log.info(
            "local memory server %s for %s: socket %s, inspector on %s",
            __version__,
            self._settings.storage.data_dir,
            self._place.socket,
            self._inspector.address,
        )
        try:
            self._accept(listener)
        except KeyboardInterrupt:
            self._stop("interrupted")
        finally:
            with contextlib.suppress(FileNotFoundError, AttachError), self._place.opened() as folder:
                if os.stat(SOCKET, dir_fd=folder.fd, follow_symlinks=False).st_ino == self._bound:  # not a newer one
                    os.unlink(SOCKET, dir_fd=folder.fd)
            listener.close()
            log.info("local memory server stops: %s", self._stopping)
            self._inspector.stop()
            self._end_sessions()

    def _listen(self) -> socket.socket:
        """The socket, bound under a name of its own and renamed into place: a socket left by a crash is replaced in
        one step, and a session never connects to one not yet listening. All of it through the folder's checked
        descriptor: the socket found there is the one bound (where the bind takes a path, it may not be)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fresh = f"{SOCKET}.{os.getpid()}"
        with self._place.opened() as folder:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fresh, dir_fd=folder.fd)
            listener.bind(folder.through(fresh))
            try:
                self._bound = os.stat(fresh, dir_fd=folder.fd, follow_symlinks=False).st_ino
            except FileNotFoundError:  # bound by its path, which led elsewhere
                raise AttachError(f"the socket was bound outside {folder.path}: another user moved it") from None
            os.chmod(fresh, 0o600, dir_fd=folder.fd)
            listener.listen(64)
            os.replace(fresh, SOCKET, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        return listener

    def _accept(self, listener: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        selector.register(self._wake_read, selectors.EVENT_READ)
        idle_seconds = self._settings.serving.local_idle_seconds
        while True:
            with self._lock:
                if self._stopping:
                    return
                left = None if self._sessions else self._idle_since + idle_seconds - time.monotonic()
                if left is not None and left <= 0:
                    self._stopping = f"no session for {idle_seconds:g} s"
                    return
            for key, _ in selector.select(left):
                if key.fileobj is listener:
                    connection, _ = listener.accept()
                    threading.Thread(target=self._serve_connection, args=(connection,), daemon=True).start()
                else:
                    os.read(self._wake_read, 512)

    def _stop(self, reason: str) -> None:
        with self._lock:
            self._stopping = self._stopping or reason
        os.write(self._wake_write, b".")

    def _end_sessions(self) -> None:
        """Stop reading the sessions' requests; wait a little for the answers of those read (then they are cut)."""
        with self._lock:
            sessions = list(self._sessions)
        for connection in sessions:
            with contextlib.suppress(OSError):  # a session that closed meanwhile
                connection.shutdown(socket.SHUT_RD)
        deadline = time.monotonic() + STOP_SECONDS
        while self._sessions and time.monotonic() < deadline:
            time.sleep(0.05)

    def _serve_connection(self, connection: socket.socket) -> None:
        """One connection, in a thread of its own: check who it is, its greeting, then its MCP session if admitted."""
        admitted = False
        try:
            uid = peer_uid(connection)
            if uid != os.getuid():
                log.warning("refused a connection of user %s: this server is user %d's", uid, os.getuid())
                return
            connection.settimeout(GREETING_SECONDS)
            hello = decode(Hello, read_line(connection))
            answer, settings = self._admit(hello, connection)
            admitted = settings is not None
            connection.sendall(encode(answer))
            if settings is not None:
                connection.settimeout(None)
                server = self._server_for(settings)
                anyio.run(run_session, server, socket_streams(connection))
        except (OSError, ValueError) as error:  # a stranger, a session gone mid-greeting
            log.debug("connection ended: %s", error)
        except Exception:
            log.exception("a session failed")
        finally:
            if admitted:
                self._leave(connection)
            connection.close()

    def _admit(self, hello: Hello, connection: socket.socket) -> tuple[Answer, Settings | None]:
        """The answer to ``hello``, and the session's settings when it is admitted (module docstring)."""
        if hello.kind == "status":
            return self._answer(True), None
        if hello.kind == "stop":
            self._stop(f"stopped by pid {hello.pid}")
            return self._answer(True), None
        settings, differs = None, ""
        if hello.build != self._build:
            theirs, mine = f"{hello.version} (build {hello.build})", f"{__version__} (build {self._build})"
            differs = f"it runs memrl-mcp {theirs}, the server {mine}"
        else:
            try:
                settings = self._settings_of(hello)
            except SettingsError as error:
                return self._answer(False, message=str(error)), None
            differs = self._differences(settings)
        with self._lock:
            if self._stopping:
                return self._answer(False, retry=True, message=f"the server is stopping ({self._stopping})"), None
            if not differs:
                self._sessions.add(connection)
                return self._answer(True), settings
            if not self._sessions:
                self._stopping = f"a session needs another server: {differs}"
                os.write(self._wake_write, b".")
                return self._answer(False, retry=True, message=self._stopping), None
            count = len(self._sessions)
        return self._answer(False, message=refusal(self._settings.storage.data_dir, hello.pid, differs, count)), None

    def _server_for(self, settings: Settings) -> MCPServer:
        """The MCP server of the sessions with these settings of their own: built at the first such session (its
        tools' schemas take tens of milliseconds to build), then served to each over its own connection and loop,
        as an HTTP server serves its sessions; they share its sampling budget as an HTTP server's tokenless clients
        do."""
        own = {name: settings.value(name) for name in SESSION_SETTINGS} | {"named": settings.is_set("namespace")}
        key = json.dumps(own, sort_keys=True, default=str)  # a path setting (project_dir) as its text
        with self._building:
            if key not in self._servers:
                self._servers[key] = create_server(self._service, None, single_client=True, settings=settings)
            return self._servers[key]

    def _settings_of(self, hello: Hello) -> Settings:
        """The session's settings, read as a process of its own would read them (its environment, config file and
        working folder); its store is the server's, however the session spelled its path."""
        store = self._settings.storage.data_dir
        if os.path.realpath(hello.data_dir) != os.path.realpath(store):  # another store whose folder's name collides
            raise SettingsError(f"data_dir: this session's store is {hello.data_dir}, this server's {store}")
        return load_settings(hello.config, hello.environ, relative_to=Path(hello.cwd), data_dir=store)

    def _differences(self, session: Settings) -> str:
        """The settings of the memory in which ``session`` differs from the server (empty: none), each named with
        where the session took it from."""
        names = []
        for group in MEMORY_GROUPS:
            mine, theirs = getattr(self._settings, group), getattr(session, group)
            for name in type(mine).model_fields:
                if getattr(mine, name) != getattr(theirs, name):
                    names.append(f"{name} (the session's from {session.origin(name)})")
        return f"its settings of the memory differ: {', '.join(names)}" if names else ""

    def _leave(self, connection: socket.socket) -> None:
        with self._lock:
            self._sessions.discard(connection)
            if not self._sessions:
                self._idle_since = time.monotonic()
        os.write(self._wake_write, b".")

    def _answer(self, ok: bool, message: str = "", retry: bool = False) -> Answer:
        return Answer(
            ok=ok,
            version=__version__,
            build=self._build,
            pid=os.getpid(),
            message=message,
            retry=retry,
            data_dir=str(self._settings.storage.data_dir),
            sessions=len(self._sessions),
            ui=self._inspector.url,
            started=self._started,
        )


def refusal(data_dir: Path, pid: int, differs: str, sessions: int) -> str:
    return (
        f"the local memory server of {data_dir} serves {sessions} other session(s) and cannot serve this one "
        f"(pid {pid}) as well: {differs}. Sessions of one store share one memory and its settings; this one can "
        "attach once the others have ended (the server then restarts for it), or after `memrl-mcp local stop` "
        "(their next call restarts it), or run in a process of its own on another store (--no-attach, with its own "
        "--data-dir)."
    )


class Inspector:
    """The local server's ``/ui`` (and its HTTP routes) on a loopback port chosen at start, for the holder of a
    token made at start (module docstring), served by uvicorn in a thread of its own."""

    def __init__(self, service: MemoryService) -> None:
        token = secrets.token_urlsafe(32)
        grant = TokenGrant.model_validate({"name": "local", "token": token, "namespaces": [ALL_NAMESPACES]})
        tokens = TokenTable([grant])
        app = http_app(service, "streamable-http", LOOPBACK, tokens)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((LOOPBACK, 0))
        port = self._socket.getsockname()[1]
        self.address = f"http://{LOOPBACK}:{port}"
        self.url = f"{self.address}/ui#token={token}"
        self._uvicorn = uvicorn.Server(uvicorn.Config(app, **UVICORN_OPTIONS))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=STOP_SECONDS)

    def _serve(self) -> None:
        self._uvicorn.run(sockets=[self._socket])
