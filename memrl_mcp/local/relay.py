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

At the end of stdin the relay closes its half of the connection; the server answers what it read, closes, and the
relay exits. A session the server refuses (another version of memrl-mcp serving other sessions, settings of the
memory that differ from the server's) or that cannot start one ends with the reason on stderr and as the error
answer of each request, so that the client shows it rather than "connection closed".
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from typing import Any

from memrl_mcp.local.attach import GREETING_SECONDS, Attached, Target, attach
from memrl_mcp.local.place import AttachError

CHUNK = 1 << 16  # below malloc's mmap threshold: a bigger buffer cost three more system calls per message
CONNECTION_CLOSED = -32000  # the code the MCP SDK's client uses for a connection that closed under a request
REPLAYED = "memrl-mcp-relay-initialize"  # the id of a replayed handshake: no id of the client's, which it never sees
ANSWER = re.compile(rb'\{"jsonrpc":"2\.0","id":(-?\d+|"(?:[^"\\]|\\.)*"),"(?:result|error)":')
"""The head of an answer as the server writes it (the MCP SDK's compact JSON, in the fields' order)."""
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

    def __init__(self, target: Target, attached: Attached) -> None:
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
        self._joined(attached)

    def run(self) -> int:
        """Relay until the client closed stdin and the server finished the session; the exit status."""
        reading = True
        while reading or self._connection is not None:
            server = self._connection
            # select() takes pipes, terminals, files and sockets on every platform, and costs least for two.
            watched: list[int | socket.socket] = [0] if reading else []
            if server is not None:
                watched.append(server)
            ready, _, _ = select.select(watched, [], [])
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
        if attached.started is not None:
            self._started.append(attached.started)

    def _from_client(self, lines: list[bytes]) -> None:
        """Note what the client's lines ask or answer, and pass them on (module docstring)."""
        passed = [out for line in lines if (out := self._noted_from_client(line)) is not None]
        if not passed:
            return
        if self._connection is None:
            try:
                self._attach_again()
            except (AttachError, OSError) as error:
                self._pending.clear()
                for line in passed:
                    for item in _items(_message(line)):
                        if isinstance(item.get("method"), str) and isinstance(item.get("id"), Id):
                            self._to_client(_error(item["id"], f"the memory server cannot be reached: {error}"))
                return
        assert self._connection is not None
        try:
            self._connection.sendall(b"".join(passed))
        except OSError:
            self._lost()

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
                self._pending.discard(json.loads(answered.group(1)))
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

    def _attach_again(self) -> None:
        """Attach to the store's server (started if none runs) and replay the client's handshake to it."""
        attached = attach(self._target)
        connection = attached.connection
        try:
            if self._handshake is not None:
                connection.sendall(json.dumps({**self._handshake, "id": REPLAYED}).encode() + b"\n")
                self._await_handshake(connection)
                if self._initialized:
                    connection.sendall(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        except BaseException:
            connection.close()
            raise
        self._joined(attached)

    def _await_handshake(self, connection: socket.socket) -> None:
        """Read up to the answer of the replayed handshake, all of it within ``GREETING_SECONDS`` (TimeoutError else,
        however slowly it comes); what follows it stays for the session."""
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
                    return

    def _to_client(self, message: dict[str, Any]) -> None:
        self._write(json.dumps(message).encode() + b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


def main(target: Target) -> int:
    """Attach (starting the server when none runs) and relay until the session ends; a refusal is reported."""
    try:
        attached = attach(target)
    except AttachError as error:
        return refuse(str(error))
    try:
        return Relay(target, attached).run()
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
