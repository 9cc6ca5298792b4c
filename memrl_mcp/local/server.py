"""The local memory server: one process per user and store, which owns the store and serves every session attached
to it (``memrl-mcp`` over stdio, :mod:`memrl_mcp.local.relay`; hooks and scripts, :mod:`memrl_mcp.local.attach`),
started by the first of them and gone after ``local_idle_seconds`` without any.

Each session is a connection to the server's Unix socket (:mod:`memrl_mcp.local.place`), served exactly as a
stdio server serves its one client: an MCP session (of the server :func:`~memrl_mcp.surface.server.create_server`
builds with ``single_client`` for the sessions with its settings) over the same stream machinery
(:func:`~memrl_mcp.transports.stdio.socket_streams`), on an event loop of its own in a thread of its own, so what one
session waits for (the store's write lock on the loop, a question to its user) holds back no other. All of them
share one :class:`~memrl_mcp.memory.service.MemoryService`, which is safe for concurrent callers. Per session: its
roots (project namespace), its questions to its client, its protocol era, and its own settings among
:data:`SESSION_SETTINGS` (what it is offered, its default namespace, its bounds on questions and samplings).

What one session may take of the server is bounded, so that none can exhaust it for the others: a connection is
read by the accepting thread until it has greeted (a silent one costs no thread), within one deadline for the whole
greeting, and at most :data:`UNGREETED` wait at once; at most ``local_max_sessions`` sessions are served; a message
is at most ``max_message_mb``, and at most ``max_requests_in_flight`` await their answers
(:mod:`~memrl_mcp.transports.stdio`); a session's calls keep at most
``local_session_threads`` worker threads busy; its questions to its client count against its own
``max_open_questions_per_token`` (:data:`~memrl_mcp.surface.asking.SESSION`); and the MCP server of settings no
session uses any more is freed, beyond the :data:`IDLE_SERVERS` last used.

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
- the same memory and bounds: the session's settings of the groups that shape the memory (:data:`MEMORY_GROUPS`),
  and the bounds of the server (:data:`SERVER_SETTINGS`), must be the server's; else the same as above (a restart
  when nobody else is served, a refusal naming the settings when somebody is).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import uvicorn
from mcp.server import MCPServer

from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError
from memrl_mcp.local.greeting import GREETING_LIMIT, Answer, Hello, decode, encode
from memrl_mcp.local.place import OWNER_LOCK, SOCKET, AttachError, Place, build_identity, flocked, peer_uid, place_of
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import ALL_NAMESPACES, Settings, SettingsError, TokenGrant, load_grants, load_settings
from memrl_mcp.surface.asking import SESSION
from memrl_mcp.surface.auth import TokenTable, is_loopback
from memrl_mcp.surface.feedback import open_questions
from memrl_mcp.surface.server import create_server
from memrl_mcp.transports.http import UVICORN_OPTIONS, http_app
from memrl_mcp.transports.stdio import Bounds, run_session, socket_streams

GREETING_SECONDS = 10.0  # a session greets at once; a connection that has not greeted within this is dropped
UNGREETED = 32  # connections waiting to greet at once; one more drops the oldest (a session greets at once)
UI = "ui.json"  # in the store's runtime folder: the inspector's port and token, for the next server
IDLE_SERVERS = 8  # MCP servers of settings no session uses, kept for the next such session (each takes ~0.1 s)
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
    "max_open_questions_per_token",
    "max_samplings_per_minute",
)
"""The settings each session has its own of: what its MCP server offers and shows, its namespaces, and its bounds
on questions to its client (counted per session: the sessions have no tokens)."""
SERVER_SETTINGS = ("max_message_mb", "max_requests_in_flight", "local_max_sessions", "local_session_threads")
"""The bounds of what a session may take of the server: the server's, as the memory's groups are."""
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
        self._inspector = Inspector(service, place)
        self._bound = 0  # the inode of the socket file this server bound
        self._servers: dict[str, Served] = {}  # by the sessions' own settings, the least recently used first (_serving)
        self._questions = open_questions(service)  # shared by every MCP server: a recall is asked about once
        self._numbers = itertools.count(1)  # of the sessions: what their bounds are counted by (SESSION)

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
            listener.setblocking(False)  # accepted until none waits (_arrived)
            os.replace(fresh, SOCKET, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        return listener

    def _accept(self, listener: socket.socket) -> None:
        """Accept connections and read their greetings (:class:`Greetings`); each greeted one is served in a thread
        of its own."""
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        selector.register(self._wake_read, selectors.EVENT_READ)
        idle_seconds = self._settings.serving.local_idle_seconds
        with Greetings(selector) as greetings:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    left = None if self._sessions else self._idle_since + idle_seconds - time.monotonic()
                    if left is not None and left <= 0:
                        self._stopping = f"no session for {idle_seconds:g} s"
                        return
                for key, _ in selector.select(greetings.timeout(left)):
                    if key.fileobj is listener:
                        self._arrived(listener, greetings)
                    elif key.fileobj == self._wake_read:
                        os.read(self._wake_read, 512)
                    elif (greeted := greetings.read(key.data)) is not None:
                        threading.Thread(target=self._serve_connection, args=greeted, daemon=True).start()
                greetings.expire()

    def _arrived(self, listener: socket.socket, greetings: Greetings) -> None:
        """The new connections, all that wait (so that a flood of them fills no backlog that a session would find
        full): each closed unread unless this user's, else left to greet."""
        while True:
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                return
            uid = peer_uid(connection)
            if uid != os.getuid():
                log.warning("refused a connection of user %s: this server is user %d's", uid, os.getuid())
                connection.close()
                continue
            greetings.add(connection)

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

    def _serve_connection(self, connection: socket.socket, greeting: bytes) -> None:
        """One greeted connection, in a thread of its own: the answer to its greeting, then its MCP session if
        admitted."""
        admitted = False
        try:
            hello = decode(Hello, greeting)
            answer, settings = self._admit(hello, connection)
            admitted = settings is not None
            listener = None
            if settings is not None and hello.kind == "http":
                try:
                    listener = http_listener(hello.host, hello.port, settings)
                except (MemrlError, SettingsError) as error:  # AttachError, a tokens file that cannot be read
                    answer, settings = self._answer(False, message=str(error)), None
            connection.settimeout(GREETING_SECONDS)  # an answer the session does not take in time ends it
            connection.sendall(encode(answer))
            if listener is not None and settings is not None:
                connection.settimeout(None)
                self._serve_http(settings, listener, hello, connection)
            elif settings is not None:
                connection.settimeout(None)
                SESSION.set(str(next(self._numbers)))  # this thread's: its loop and worker threads inherit it
                with self._serving(settings) as server:
                    anyio.run(self._session, server, connection)
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
            most = self._settings.serving.local_max_sessions
            if not differs and len(self._sessions) >= most:
                return self._answer(False, message=crowded(self._settings.storage.data_dir, hello.pid, most)), None
            if not differs:
                self._sessions.add(connection)
                return self._answer(True), settings
            if not self._sessions:
                self._stopping = f"a session needs another server: {differs}"
                os.write(self._wake_write, b".")
                return self._answer(False, retry=True, message=self._stopping), None
            count = len(self._sessions)
        return self._answer(False, message=refusal(self._settings.storage.data_dir, hello.pid, differs, count)), None

    @contextlib.contextmanager
    def _serving(self, settings: Settings) -> Iterator[MCPServer]:
        """The MCP server of the sessions with these settings of their own, while one of them is served: built at
        the first such session (its tools' schemas take ~0.1 s to build), then served to each over its own connection
        and loop, as an HTTP server serves its sessions. Once none uses it, it is kept for the next such session
        while it is among the :data:`IDLE_SERVERS` last used, and freed after (every new project folder is new
        settings: most of a MB each, kept for good, grew the server without end)."""
        own = {name: settings.value(name) for name in SESSION_SETTINGS} | {"named": settings.is_set("namespace")}
        key = json.dumps(own, sort_keys=True, default=str)  # a path setting (project_dir) as its text
        with self._building:
            served = self._servers.pop(key, None)
            if served is None:
                built = create_server(self._service, single_client=True, settings=settings, questions=self._questions)
                served = Served(built)
            self._servers[key] = served  # the most recently used last
            served.sessions += 1
        try:
            yield served.server
        finally:
            with self._building:
                served.sessions -= 1
                idle = [name for name, kept in self._servers.items() if not kept.sessions]
                for name in idle[: max(0, len(idle) - IDLE_SERVERS)]:
                    del self._servers[name]

    def _serve_http(self, settings: Settings, listener: socket.socket, hello: Hello, connection: socket.socket) -> None:
        """Streamable HTTP on ``listener`` (:func:`http_listener`), an MCP server of ``settings`` over the shared
        memory, for as long as ``connection`` (the command that asked, counted as a session) stays open: its end,
        whatever ends it (the command's Ctrl-C, its death, the server's stop), ends the HTTP server."""
        app = http_app(self._service, "streamable-http", hello.host, None, settings=settings, questions=self._questions)
        server = uvicorn.Server(uvicorn.Config(app, **UVICORN_OPTIONS))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        log.info("streamable HTTP on http://%s:%d/mcp for pid %d", hello.host, hello.port, hello.pid)
        try:
            while thread.is_alive() and connection.recv(1 << 16):  # nothing is to come: the end of the connection
                pass
        except OSError:
            pass
        finally:
            server.should_exit = True
            thread.join(timeout=STOP_SECONDS)
            listener.close()
            log.info("streamable HTTP on http://%s:%d/mcp stopped", hello.host, hello.port)

    async def _session(self, server: MCPServer, connection: socket.socket) -> None:
        """One session's MCP session, on its own event loop, with its bounds (module docstring)."""
        serving = self._settings.serving
        anyio.to_thread.current_default_thread_limiter().total_tokens = serving.local_session_threads
        await run_session(server, socket_streams(connection, Bounds.of(serving)))

    def _settings_of(self, hello: Hello) -> Settings:
        """The session's settings, read as a process of its own would read them (its environment, config file and
        working folder); its store is the server's, however the session spelled its path."""
        store = self._settings.storage.data_dir
        if os.path.realpath(hello.data_dir) != os.path.realpath(store):  # another store whose folder's name collides
            raise SettingsError(f"data_dir: this session's store is {hello.data_dir}, this server's {store}")
        return load_settings(hello.config, hello.environ, relative_to=Path(hello.cwd), data_dir=store)

    def _differences(self, session: Settings) -> str:
        """The settings of the memory and the server's bounds in which ``session`` differs from the server (empty:
        none), each named with where the session took it from."""
        memory = [name for group in MEMORY_GROUPS for name in type(getattr(self._settings, group)).model_fields]
        names = [
            f"{name} (the session's from {session.origin(name)})"
            for name in (*memory, *SERVER_SETTINGS)
            if self._settings.value(name) != session.value(name)
        ]
        return f"its settings of the memory or of the server's bounds differ: {', '.join(names)}" if names else ""

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


def http_listener(host: str, port: int, settings: Settings) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` for a command's streamable HTTP; loopback only and without tokens
    (the sessions of a local server have no tokens: a command that has them runs a server of its own,
    ``--transport streamable-http --no-attach``). AttachError saying why when the port cannot be had."""
    if load_grants(settings.serving):
        raise AttachError(
            "the local memory server serves HTTP without tokens, on loopback only: with tokens, run a server of "
            "its own (`memrl-mcp --transport streamable-http --no-attach`, on a store no local server holds)"
        )
    if not is_loopback(host):
        raise AttachError(
            f"the local memory server serves HTTP on loopback only (127.0.0.1, ::1), not on {host}: anyone who "
            "reaches the port could read and change every memory"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: not a port in use
        listener.bind((host.strip("[]"), port))
        listener.listen(2048)
    except OSError as error:
        listener.close()
        why = "it is in use (another server listens there)" if error.errno == errno.EADDRINUSE else error.strerror
        raise AttachError(f"cannot serve HTTP on {host} port {port}: {why}") from None
    return listener


def crowded(data_dir: Path, pid: int, most: int) -> str:
    return (
        f"the local memory server of {data_dir} serves {most} sessions, the most it serves at once "
        f"(local_max_sessions={most}), and cannot serve this one (pid {pid}) as well: end a session, or raise "
        "local_max_sessions in the settings of the session that starts the server (after `memrl-mcp local stop`)."
    )


def refusal(data_dir: Path, pid: int, differs: str, sessions: int) -> str:
    return (
        f"the local memory server of {data_dir} serves {sessions} other session(s) and cannot serve this one "
        f"(pid {pid}) as well: {differs}. Sessions of one store share one memory and its settings; this one can "
        "attach once the others have ended (the server then restarts for it), or after `memrl-mcp local stop` "
        "(their next call restarts it), or run in a process of its own on another store (--no-attach, with its own "
        "--data-dir)."
    )


@dataclass
class Served:
    """An MCP server of the sessions of some settings, and how many of them it serves."""

    server: MCPServer
    sessions: int = 0


@dataclass
class Ungreeted:
    """A connection whose greeting is still coming, what came of it, and when it is too late."""

    connection: socket.socket
    deadline: float
    line: bytes = b""


class Greetings:
    """The connections whose greeting is still coming, read by the accepting thread as their bytes arrive, so that a
    silent connection costs no thread. Each has one deadline for its whole greeting, however slowly its bytes come;
    at most :data:`UNGREETED` wait at once, and one more drops the oldest (a session greets as it connects, so a
    flood of silent connections delays no session's greeting)."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        self._waiting: dict[socket.socket, Ungreeted] = {}  # the oldest first

    def add(self, connection: socket.socket) -> None:
        if len(self._waiting) >= UNGREETED:
            self._drop(next(iter(self._waiting)), f"more than {UNGREETED} connections waiting to greet")
        connection.setblocking(False)
        waiting = Ungreeted(connection, time.monotonic() + GREETING_SECONDS)
        self._waiting[connection] = waiting
        self._selector.register(connection, selectors.EVENT_READ, waiting)

    def read(self, waiting: Ungreeted) -> tuple[socket.socket, bytes] | None:
        """The connection and its greeting once its whole line came (None before); nothing beyond the line's newline
        is taken, since what follows is the MCP session's."""
        connection = waiting.connection
        try:
            peeked = connection.recv(65536, socket.MSG_PEEK)
            if not peeked:
                raise ConnectionError("the connection closed before its greeting")
            end = peeked.find(b"\n")
            waiting.line += connection.recv(len(peeked) if end < 0 else end + 1)
            if end < 0 and len(waiting.line) > GREETING_LIMIT:
                raise ValueError(f"a greeting is at most {GREETING_LIMIT} bytes")
        except BlockingIOError:
            return None
        except (OSError, ValueError) as error:
            self._drop(connection, str(error))
            return None
        if end < 0:
            return None
        self._selector.unregister(connection)
        del self._waiting[connection]
        connection.setblocking(True)
        return connection, waiting.line

    def timeout(self, idle: float | None) -> float | None:
        """How long the accepting thread may wait: until ``idle`` (None: for ever), or the next deadline if sooner."""
        if not self._waiting:
            return idle
        first = min(waiting.deadline for waiting in self._waiting.values()) - time.monotonic()
        return max(0.0, first if idle is None else min(idle, first))

    def expire(self) -> None:
        now = time.monotonic()
        for connection in [c for c, waiting in self._waiting.items() if waiting.deadline <= now]:
            self._drop(connection, f"no greeting within {GREETING_SECONDS:g} s")

    def _drop(self, connection: socket.socket, why: str) -> None:
        log.debug("connection dropped: %s", why)
        self._selector.unregister(connection)
        del self._waiting[connection]
        connection.close()

    def __enter__(self) -> Greetings:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for connection in list(self._waiting):
            self._drop(connection, "the server stops")


class Inspector:
    """The local server's ``/ui`` (and its HTTP routes) on a loopback port, for the holder of a token, served by
    uvicorn in a thread of its own. The port and the token are those of the server before (kept in ``ui.json``,
    0600, in the store's private runtime folder), so a bookmarked address still opens the page after a restart;
    a new port when that one is taken, a new token when none was kept."""

    def __init__(self, service: MemoryService, place: Place) -> None:
        kept = _kept_ui(place)
        token = kept.get("token")
        if not isinstance(token, str) or len(token) < 32:
            token = secrets.token_urlsafe(32)
        grant = TokenGrant.model_validate({"name": "local", "token": token, "namespaces": [ALL_NAMESPACES]})
        app = http_app(service, "streamable-http", LOOPBACK, TokenTable([grant]))
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        port = kept.get("port")
        try:
            self._socket.bind((LOOPBACK, port if isinstance(port, int) and 1024 <= port < 65536 else 0))
        except OSError:  # taken meanwhile by another program: a new one
            self._socket.bind((LOOPBACK, 0))
        port = self._socket.getsockname()[1]
        _keep_ui(place, {"port": port, "token": token})
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


def _kept_ui(place: Place) -> dict[str, object]:
    """The inspector's port and token of the server before ({} when none, or unreadable)."""
    try:
        with place.opened() as folder, open(folder.open(UI, os.O_RDONLY), "rb") as stream:
            kept = json.loads(stream.read())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _keep_ui(place: Place, kept: dict[str, object]) -> None:
    """Keep the inspector's port and token for the next server, 0600, renamed into place whole."""
    temporary = f"{UI}.{os.getpid()}"
    with place.opened() as folder:
        with open(folder.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as stream:
            json.dump(kept, stream)
        os.replace(temporary, UI, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
