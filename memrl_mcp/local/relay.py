"""The stdio entry of a session attached to the local memory server: a relay of bytes between the client's pipes
and the session's connection to the server.

Each line the client writes goes to the server as it is, and each line the server writes goes back to the client:
the MCP session runs end to end between the client and its own session in the server (roots, elicitation,
sampling, progress, cancellation, either protocol era), and the relay parses a line only to keep count of what is in
flight. It needs the standard library alone: it starts in tens of milliseconds.

When the server goes away (a crash, a ``memrl-mcp local stop``), each request of the client it had not answered is
answered here with an error saying that the call may or may not have been applied; the session itself lives on. The
next line the client writes attaches again (starting a server when none runs), replays the client's ``initialize``
handshake to the new server (its answer is not passed on: the client has had one) and goes on. A session of the
2026-07-28 protocol has no handshake; each of its requests carries what the server needs.

The server's own questions (elicitation, sampling, roots) reach the client under ids of the relay's, unique for the
relay's whole life, and the client's answers go back under the server's: a new server counts its ids from the start
again, and an answer the client gives late to a question of a server that died must never settle the new server's
question of the same id. When a server dies, each of its open questions is withdrawn in the client
(``notifications/cancelled``), and an answer to it is dropped: nobody waits for it any more. (On the 2026-07-28
protocol a question travels in the call's own result and its answer in the call made again, under state sealed by
the server that asked: a new server refuses it and asks anew.)

The handshake never waits for the memory (a client such as Claude Code leaves a server whose handshake fails out of
its sessions for 15 minutes). With no server running, the relay starts one behind and answers ``initialize`` and
``tools/list`` at once with what the server last answered for the same build and settings (kept, 0600, in the
store's runtime folder: ``answers.json``, written from the server's real answers once a session reaches it); with
none kept (the first session of a build and settings), ``initialize`` is answered with the least that names the
server, and ``tools/list`` waits for the server, so that the tools listed are its own; ``server/discover`` is
answered with an error, so that the client takes the handshake. Other requests wait for the server; once it
answers, the handshake is replayed to it, what waited is passed on, and the client is told
(``notifications/tools/list_changed``) if the tools differ from those listed. A memory that cannot be reached (the
server refuses the session: another version beside other sessions, other settings of the memory; or cannot start:
the store held by another process) is said on stderr, in the instructions, and as the tool error of each call (an
error answer for other requests; no tools listed); a call made 5 s or more after the last attempt tries again.

At the end of stdin the relay closes its half of the connection; the server answers what it read, closes, and the
relay exits. A session whose settings cannot even be read, or that runs in a process of its own which cannot open
the store, ends with the reason on stderr and as the error answer of each request (:func:`refuse`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from memrl_mcp import __version__
from memrl_mcp.local.attach import GREETING_SECONDS, Attached, NotRunningError, Target, attach
from memrl_mcp.local.place import AttachError, place_of

CHUNK = 1 << 16  # below malloc's mmap threshold: a bigger buffer cost three more system calls per message
CONNECTION_CLOSED = -32000  # the code the MCP SDK's client uses for a connection that closed under a request
REPLAYED = "memrl-mcp-relay-initialize"  # the id of a replayed handshake: no id of the client's, which it never sees
ANSWER = re.compile(rb'\{"jsonrpc":"2\.0","id":(-?\d+|"(?:[^"\\]|\\.)*"),"(?:result|error)":')
"""The head of an answer as the server writes it (the MCP SDK's compact JSON, in the fields' order)."""
LISTED = "memrl-mcp-relay-tools"  # the id of the relay's own tools/list, whose answer is kept (never passed on)
ANSWERS = "answers.json"  # in the store's runtime folder: the server's answers kept for the next cold start
KEPT_ANSWERS = 16  # builds and settings whose answers are kept, the most recently used
RETRY_SECONDS = 5.0  # after a failed attempt to reach the memory, calls are answered at once for this long
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""The protocol versions of the handshake the MCP SDK's server speaks (checked against it by a test), the last its
latest: what the relay's own answer to ``initialize`` agrees to, as the server would."""
EMPTY: dict[str, dict[str, list[Any]]] = {"resources/list": {"resources": []}, "prompts/list": {"prompts": []}}
EMPTY["resources/templates/list"] = {"resourceTemplates": []}
EMPTY["tools/list"] = {"tools": []}  # no tools while the memory cannot be reached (the instructions say why)
Id = str | int


class Lines:
    """Complete lines out of a byte stream's chunks."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buffer and data.endswith(b"\n"):  # the common case: whole messages, nothing left over
            return data.splitlines(keepends=True)
        start = len(self._buffer)
        self._buffer += data
        end = self._buffer.rfind(b"\n", start)
        if end < 0:
            return []
        lines = bytes(self._buffer[: end + 1]).splitlines(keepends=True)
        del self._buffer[: end + 1]
        return lines

    def rest(self) -> bytes:
        """What was fed after the last complete line."""
        return bytes(self._buffer)


class Relay:
    """One session's relay (module docstring)."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._connection: socket.socket | None = None
        self._server_pid = 0
        self._started: list[subprocess.Popen[bytes]] = []  # servers this relay started: reaped when they end
        self._client_lines, self._server_lines = Lines(), Lines()
        self._pending: set[Id] = set()  # the client's requests the server has not answered
        self._ids = itertools.count(1)  # the ids the client sees of the server's requests (module docstring)
        self._asked: dict[int, Id] = {}  # the server's requests the client has not answered: the server's id by ours
        self._asking: dict[Id, int] = {}  # the same, ours by the server's
        self._handshake: dict[str, Any] | None = None  # the client's initialize request
        self._initialized = False
        self._hello = target.hello("session")  # its build and settings' inputs: the key of the answers kept
        self._reason = ""  # why the memory cannot be reached, since the last attempt failed
        self._failed_at = 0.0
        self._attaching = False  # an attempt runs in a thread of its own (_start_attaching)
        self._arrival: Attached | BaseException | None = None
        self._wake_read, self._wake_write = os.pipe()
        self._queued: list[bytes] = []  # the client's lines that wait for the server
        self._served_tools: Any = None  # the tools/list this relay answered itself, to check against the server's
        self._initialize_id: Id | None = None  # the client's initialize, passed to the server: its answer is kept
        self._listed = False  # the relay's own tools/list was sent on this connection

    def begin(self) -> None:
        """Attach at once to a server that runs; else start one behind (the client's handshake is answered
        meanwhile), or note why none can be reached."""
        try:
            self._joined(attach(self._target, start=False, timeout=GREETING_SECONDS))
        except NotRunningError:
            self._start_attaching()
        except (AttachError, OSError) as error:
            self._unavailable(str(error))

    def run(self) -> int:
        """Relay until the client closed stdin and the server finished the session; the exit status."""
        reading = True
        while reading or self._connection is not None or self._attaching:  # a start behind: kept for next time
            server = self._connection
            # select() takes pipes, terminals, files and sockets on every platform, and costs least for two.
            watched: list[int | socket.socket] = [0] if reading else []
            if server is not None:
                watched.append(server)
            if self._attaching:
                watched.append(self._wake_read)
            ready, _, _ = select.select(watched, [], [])
            if self._wake_read in ready:
                os.read(self._wake_read, 1)
                self._arrived(reading)
            if 0 in ready:
                data = os.read(0, CHUNK)
                if data:
                    self._from_client(self._client_lines.feed(data))
                else:
                    reading = False
                    if self._connection is not None:
                        self._connection.shutdown(socket.SHUT_WR)  # the server answers what it read, then ends
            if server is not None and server in ready and server is self._connection:
                try:
                    data = server.recv(CHUNK)
                except OSError:
                    data = b""
                if data:
                    self._from_server(self._server_lines.feed(data))
                else:
                    self._lost()
        return 0

    def _joined(self, attached: Attached) -> None:
        self._connection = attached.connection
        self._connection.settimeout(None)  # blocking: a socket with a timeout polls before each send and receive
        self._server_pid = attached.answer.pid
        self._reason = ""
        self._listed = False
        if attached.started is not None:
            self._started.append(attached.started)

    def _start_attaching(self) -> None:
        """Attach (starting a server when none runs) in a thread, which wakes the loop when done (_arrived)."""
        self._attaching = True

        def attempt() -> None:
            try:
                self._arrival = attach(self._target)
            except BaseException as error:  # handed to the loop, which says why
                self._arrival = error
            os.write(self._wake_write, b".")

        threading.Thread(target=attempt, name="attach", daemon=True).start()

    def _arrived(self, reading: bool) -> None:
        """The attempt ended: replay the handshake to the server and pass on what waited, or answer it with why
        the memory cannot be reached."""
        self._attaching = False
        arrival, self._arrival = self._arrival, None
        queued, self._queued = self._queued, []
        if isinstance(arrival, Attached):
            try:
                self._replay(arrival)
            except (AttachError, OSError) as error:
                arrival.connection.close()
                arrival = error
            else:
                self._joined(arrival)
                assert self._connection is not None
                try:
                    if queued:
                        self._connection.sendall(b"".join(queued))
                    self._list_tools()
                    if not reading:
                        self._connection.shutdown(socket.SHUT_WR)
                except OSError:
                    self._lost()
                return
        self._unavailable(str(arrival) if isinstance(arrival, AttachError | OSError) else repr(arrival))
        for line in queued:
            self._offline(line)

    def _replay(self, attached: Attached) -> None:
        """Replay the client's handshake to a new server (module docstring); its answer is kept, not passed on."""
        if self._handshake is None:
            return
        connection = attached.connection
        connection.sendall(json.dumps({**self._handshake, "id": REPLAYED}).encode() + b"\n")
        answer = self._await_handshake(connection)
        self._keep("initialize", answer.get("result"))
        if self._initialized:
            connection.sendall(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')

    def _unavailable(self, reason: str) -> None:
        if reason != self._reason:
            print(f"memrl-mcp: {reason}", file=sys.stderr, flush=True)
        self._reason, self._failed_at = reason, time.monotonic()

    def _from_client(self, lines: list[bytes]) -> None:
        """Note what the client's lines ask or answer, and pass them on (module docstring)."""
        passed = [out for line in lines if (out := self._noted_from_client(line)) is not None]
        if not passed:
            return
        if self._connection is None:
            for line in passed:
                self._offline(line)
            return
        try:
            self._connection.sendall(b"".join(passed))
            self._list_tools()
        except OSError:
            self._lost()

    def _offline(self, line: bytes) -> None:
        """A line of the client while no server is attached: answered here when it can be (the handshake, the
        tools' list), else kept for the server being reached, else answered with why it cannot be."""
        message = _message(line)
        if not isinstance(message, dict):  # a batch, or no JSON: for the server
            if self._wants_server():
                self._queued.append(line)
                return
            for item in _items(message):
                if isinstance(item.get("method"), str) and isinstance(item.get("id"), Id):
                    self._answer(item["id"], error=self._why())
            return
        method, request_id = message.get("method"), message.get("id")
        if not isinstance(request_id, Id):  # a notification: notifications/initialized is replayed
            if method != "notifications/initialized" and self._attaching:
                self._queued.append(line)
            return
        kept_tools = self._kept().get("tools") if method == "tools/list" and self._handshake is not None else None
        if method == "initialize":
            self._answer(request_id, self._initialize_result(message))
        elif kept_tools:
            self._served_tools = kept_tools
            self._answer(request_id, kept_tools)
        elif method == "ping":
            self._answer(request_id, {})
        elif method == "server/discover":  # any error makes a client of either era fall back to the handshake
            self._answer(request_id, error="the memory server is not reached yet: use the initialize handshake")
        elif self._wants_server():
            self._queued.append(line)
        elif method in EMPTY:
            self._answer(request_id, EMPTY[method])
        elif method == "tools/call":
            self._answer(request_id, {"content": [{"type": "text", "text": self._why()}], "isError": True})
        else:
            self._answer(request_id, error=self._why())

    def _wants_server(self) -> bool:
        """Whether a request waits for the server: one is being reached, or may be again (RETRY_SECONDS after the
        last attempt failed)."""
        if not self._attaching and (not self._reason or time.monotonic() - self._failed_at >= RETRY_SECONDS):
            self._start_attaching()
        return self._attaching

    def _why(self) -> str:
        return (
            f"The memory (memrl-mcp) is unavailable: {self._reason or 'its server could not be reached'}. Nothing "
            "was recalled or stored; go on without it. The next call tries again."
        )

    def _initialize_result(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to the client's ``initialize`` while no server is attached: the server's own last answer to
        this build and these settings, else the least that names the server and says why the memory waits."""
        kept = self._kept(request)
        result: dict[str, Any]
        if isinstance(kept.get("initialize"), dict):
            result = dict(kept["initialize"])
        else:
            requested = (request.get("params") or {}).get("protocolVersion")
            version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
            server = {"name": "memrl-mcp", "version": __version__}
            result = {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": server,
            }
            if not self._reason:
                result["instructions"] = "The memory (memrl-mcp) is starting: its tools are listed once it has started."
        if self._reason:
            result["instructions"] = f"{result.get('instructions', '')}\n\n{self._why()}".strip()
        return result

    def _list_tools(self) -> None:
        """Once the session is initialized on this connection, ask the server for its tools: their list is kept
        for the next cold start, and the client told when what the relay listed differs (list_changed)."""
        if self._listed or not self._initialized or self._connection is None:
            return
        self._listed = True
        request = {"jsonrpc": "2.0", "id": LISTED, "method": "tools/list", "params": {}}
        self._connection.sendall(json.dumps(request).encode() + b"\n")

    def _answers_key(self, request: dict[str, Any] | None = None) -> str:
        """The key of the server's answers: the build, the settings' inputs and the protocol version asked."""
        request = request or self._handshake or {}
        hello = self._hello
        environ = {name: value for name, value in hello.environ.items() if name != "CLAUDE_PROJECT_DIR"}
        config = b""
        if self._target.config is not None:
            try:
                config = self._target.config.read_bytes()
            except OSError:
                config = b"unreadable"
        version = (request.get("params") or {}).get("protocolVersion")
        inputs = [hello.build, hello.data_dir, hello.config, hashlib.sha256(config).hexdigest(), environ, version]
        return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]

    def _kept(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The server's answers kept for this build and these settings ({} when none)."""
        entry = _read_answers(self._target).get(self._answers_key(request))
        return entry if isinstance(entry, dict) else {}

    def _keep(self, kind: str, result: Any) -> None:
        if not isinstance(result, dict) or self._handshake is None:
            return
        key = self._answers_key()
        answers = _read_answers(self._target)
        entry = answers.pop(key, None)
        answers[key] = {**(entry if isinstance(entry, dict) else {}), kind: result}  # the newest last
        _write_answers(self._target, dict(list(answers.items())[-KEPT_ANSWERS:]))

    def _answer(self, request_id: Id, result: Any = None, error: str = "") -> None:
        self._pending.discard(request_id)
        if error:
            self._to_client(_error(request_id, error))
        else:
            self._to_client({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _noted_from_client(self, line: bytes) -> bytes | None:
        """Note one line of the client; the line to pass on (an answer under the server's own id), or None for an
        answer to no open question of this server (module docstring)."""
        message = _message(line)
        if isinstance(message, dict) and _is_response(message):
            ours = message.get("id")
            if not _is_ours(ours) or ours not in self._asked:
                return None
            theirs = self._asked.pop(ours)
            del self._asking[theirs]
            return json.dumps({**message, "id": theirs}).encode() + b"\n"
        for item in _items(message):
            method, request_id = item.get("method"), item.get("id")
            if method == "initialize":
                self._handshake = item
                self._initialize_id = request_id if isinstance(request_id, Id) else None
            elif method == "notifications/initialized":
                self._initialized = True
            elif method == "notifications/cancelled":  # a cancelled request is never answered, by anyone
                cancelled = (item.get("params") or {}).get("requestId")
                if isinstance(cancelled, Id):
                    self._pending.discard(cancelled)
            if isinstance(method, str) and isinstance(request_id, Id):
                self._pending.add(request_id)
        return line

    def _from_server(self, lines: list[bytes]) -> None:
        """Note what the server's lines answer or ask, and pass them on, its questions under ids of ours."""
        passed = []
        for line in lines:
            answered = ANSWER.match(line)  # most lines: an answer, read without parsing all of it
            if answered is not None:
                answered_id = json.loads(answered.group(1))
                if answered_id == LISTED:
                    self._listed_by_server(_message(line))
                    continue
                if answered_id == self._initialize_id and self._initialize_id is not None:
                    self._initialize_id = None
                    self._keep("initialize", (_message(line) or {}).get("result"))
                self._pending.discard(answered_id)
                passed.append(line)
                continue
            message = _message(line)
            renamed = False
            for item in _items(message):
                request_id, method = item.get("id"), item.get("method")
                if _is_response(item) and isinstance(request_id, Id):
                    self._pending.discard(request_id)
                elif isinstance(method, str) and isinstance(request_id, Id):  # a question of the server's
                    item["id"] = self._asking[request_id] = next(self._ids)
                    self._asked[item["id"]] = request_id
                    renamed = True
                elif method == "notifications/cancelled":  # the server withdraws a question of its own
                    params = item.get("params")
                    withdrawn = params.get("requestId") if isinstance(params, dict) else None
                    if isinstance(params, dict) and isinstance(withdrawn, Id) and withdrawn in self._asking:
                        params["requestId"] = ours = self._asking.pop(withdrawn)
                        del self._asked[ours]
                        renamed = True
            passed.append(json.dumps(message).encode() + b"\n" if renamed else line)
        if passed:
            self._write(b"".join(passed))

    def _listed_by_server(self, message: Any) -> None:
        """The server's answer to the relay's own tools/list: kept, and the client told if it listed otherwise."""
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict):
            return
        self._keep("tools", result)
        if self._served_tools is not None and self._served_tools != result:
            self._to_client({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        self._served_tools = None

    def _lost(self) -> None:
        """The server closed the connection or died: answer what it will never answer (module docstring)."""
        assert self._connection is not None
        self._connection.close()
        self._connection = None
        self._server_lines = Lines()
        self._started = [server for server in self._started if server.poll() is None]
        message = (
            f"the memory server (pid {self._server_pid}) stopped before answering: this call may or may not have "
            "been applied. The next call reaches a new server."
        )
        for request_id in sorted(self._pending, key=str):
            self._to_client(_error(request_id, message))
        for question in sorted(self._asked):
            reason = f"the memory server that asked (pid {self._server_pid}) stopped: nobody waits for the answer"
            params = {"requestId": question, "reason": reason}
            self._to_client({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
        self._pending.clear()
        self._asked.clear()
        self._asking.clear()

    def _await_handshake(self, connection: socket.socket) -> dict[str, Any]:
        """Read up to the answer of the replayed handshake, all of it within ``GREETING_SECONDS`` (TimeoutError else,
        however slowly it comes), and return it; what follows it stays for the session."""
        deadline = time.monotonic() + GREETING_SECONDS
        lines = Lines()
        while True:
            connection.settimeout(max(deadline - time.monotonic(), 0.001))
            data = connection.recv(CHUNK)
            if not data:
                raise AttachError("the new memory server closed the connection during the handshake")
            for index, line in enumerate(found := lines.feed(data)):
                message = _message(line)
                if isinstance(message, dict) and message.get("id") == REPLAYED:
                    if "error" in message:
                        raise AttachError(f"the new memory server refused the handshake: {message['error']}")
                    connection.settimeout(None)
                    self._server_lines = Lines()
                    self._from_server(found[index + 1 :])
                    self._server_lines.feed(lines.rest())
                    return message

    def _to_client(self, message: dict[str, Any]) -> None:
        self._write(json.dumps(message).encode() + b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


def _read_answers(target: Target) -> dict[str, Any]:
    """The answers kept in the store's runtime folder ({} when none, or unreadable)."""
    try:
        with place_of(target.data_dir, target.runtime_dir).opened() as folder:
            fd = folder.open(ANSWERS, os.O_RDONLY)
        with open(fd, "rb") as stream:
            answers = json.loads(stream.read())
    except (OSError, ValueError, AttachError):
        return {}
    return answers if isinstance(answers, dict) else {}


def _write_answers(target: Target, answers: dict[str, Any]) -> None:
    """Write the answers kept (0600, under a name of this process's, renamed into place: no reader sees half)."""
    temporary = f"{ANSWERS}.{os.getpid()}"
    try:
        with place_of(target.data_dir, target.runtime_dir).opened() as folder:
            fd = folder.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with open(fd, "wb") as stream:
                stream.write(json.dumps(answers).encode())
            os.replace(temporary, ANSWERS, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    except (OSError, AttachError) as error:
        print(f"memrl-mcp: the server's answers could not be kept: {error}", file=sys.stderr, flush=True)


def main(target: Target) -> int:
    """Relay until the session ends: attached to the running server, or answering the handshake while one starts
    behind, or while none can be reached (module docstring)."""
    relay = Relay(target)
    try:
        relay.begin()
        return relay.run()
    except BrokenPipeError:  # the client went away without closing stdin first
        return 0


def refuse(reason: str) -> int:
    """End a session that cannot be served: the reason on stderr, and as the error answer of every request the
    client sends until it closes stdin (an MCP client shows that, where it shows no stderr); exit status 2, as a
    server that cannot start."""
    print(f"memrl-mcp: {reason}", file=sys.stderr, flush=True)
    lines = Lines()
    while data := os.read(0, CHUNK):
        for line in lines.feed(data):
            for item in _items(_message(line)):
                if isinstance(item.get("method"), str) and isinstance(item.get("id"), Id):
                    os.write(1, json.dumps(_error(item["id"], f"memrl-mcp: {reason}")).encode() + b"\n")
    return 2


def _message(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None  # not JSON: passed on as it is, the server answers it


def _items(message: Any) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a line (a batch holds several)."""
    items = message if isinstance(message, list) else [message]
    return [item for item in items if isinstance(item, dict)]


def _is_ours(request_id: Any) -> bool:
    """Whether ``request_id`` can be one of the relay's ids of the server's questions (a number, not a boolean)."""
    return isinstance(request_id, int) and not isinstance(request_id, bool)


def _is_response(message: dict[str, Any]) -> bool:
    return "method" not in message and ("result" in message or "error" in message)


def _error(request_id: Id, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": CONNECTION_CLOSED, "message": message}}
