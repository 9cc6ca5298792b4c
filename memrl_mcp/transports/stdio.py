"""The stdio transport, with the pipes read and written by the event loop itself.

The SDK's ``stdio_server`` reads each request line, writes each answer and flushes it through a worker thread (anyio's
``AsyncFile``): three hand-offs to another thread and back per tool call. Here asyncio's pipe transports read and write
without blocking, on the loop; the SDK's ``stdio_server`` still parses and serialises every message. A tool call costs
the server a third less CPU this way (docs/performance.md). When stdin or stdout is not a pipe or a socket (a file, a
terminal), the SDK's transport serves instead.

Like the SDK's, it claims fds 0 and 1 while it serves: the wire is read and written through private duplicates,
fd 0 reads the null device and fd 1 writes to stderr, so that nothing else in the process (a child, a stray print)
reads the requests or writes into the answers; both are given back at the end.

The local server (:mod:`memrl_mcp.local.server`) serves each session attached to it the same way, over the session's
Unix socket (:func:`socket_streams`): one MCP session per connection, as if the session had its own process.

A line the SDK's reader cannot parse is answered here with a JSON-RPC parse error (:func:`_unreadable`), where the
SDK answers nothing and the client waits for an answer that never comes: a line that is not JSON (id ``null``), and
a request whose text is not Unicode (a lone surrogate, which JSON can escape and the SDK's reader refuses), by its id.

What one session may send is bounded (:class:`Bounds`), so that it cannot grow the process (the local server's,
shared by every session of the user) by what it sends: a message (one line) longer than ``max_message_mb`` is never
held whole, but skipped as it arrives and answered with an error naming the limit and the setting
(:class:`_Requests`); a request beyond ``max_requests_in_flight`` not yet answered is answered at once with such an
error (:class:`_Draining`), and while that answer waits for the client to read, nothing more is read. The SDK's own
reader has neither bound: a client that sent requests without reading the answers grew the server without end.

The end of stdin ends the session only once every request read is answered (:class:`_Draining`): the SDK cancels
the calls still running at the end of its read stream, so ``memrl-mcp < requests.jsonl``, or a client that writes
its last requests and closes the pipe, lost the answers (and the writes) of the requests still in flight. A call
waiting for the client's answer to a question of the server's (elicitation, sampling) gets an error at once: a
client that closed stdin cannot answer. A call still running after ``DRAIN_SECONDS`` is cancelled as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Self

import anyio
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
)
from pydantic import ValidationError

from memrl_mcp.settings import ServingSettings

MB = 1 << 20
PIECE = 1 << 20  # how much of a message too long is taken at a time, to be dropped
ENDS = 256  # bytes kept of each end of a message too long: where its id is
JSON_ID = rb'(-?\d+|"(?:[^"\\]|\\.){0,200}")'
HEAD_ID = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + JSON_ID)
TAIL_ID = re.compile(rb',\s*"id"\s*:\s*' + JSON_ID + rb"\s*\}\s*\Z")
"""A request's id as its first key (the Python SDK's order) or its last (the TypeScript SDK's), at the top level."""
DRAIN_SECONDS = 60.0  # how long the calls in flight at the end of stdin may still run to answer


def is_pipe(fd: int) -> bool:
    """Whether ``fd`` is a pipe or a socket (what asyncio's pipe transports take)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


Streams = AbstractAsyncContextManager[tuple[Any, Any]]
"""The SDK's (read stream, write stream) of one session, while the context lasts."""


@dataclass(frozen=True)
class Bounds:
    """What one session may send (module docstring): the bytes of one message, the requests not yet answered."""

    message_bytes: int
    requests: int

    @classmethod
    def of(cls, serving: ServingSettings) -> Bounds:
        return cls(serving.max_message_mb * MB, serving.max_requests_in_flight)


async def run_session(server: MCPServer, streams: Streams) -> None:
    """Serve one client over ``streams`` until it leaves: what the SDK's ``run_stdio_async`` does over stdio."""
    lowlevel = server._lowlevel_server  # the server run_stdio_async runs (mcp 2.x)
    async with streams as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


@asynccontextmanager
async def stdio_streams(bounds: Bounds) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's (read stream, write stream) over this process's stdin and stdout, within ``bounds`` (module
    docstring)."""
    async with _sdk_streams(bounds.message_bytes) as (reads, writes):
        draining = _Draining(reads, writes, bounds.requests)
        yield draining, draining.writes


@asynccontextmanager
async def socket_streams(connection: socket.socket, bounds: Bounds) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's streams over one connected stream socket, read and written by the event loop as stdio's pipes are,
    within ``bounds``; the socket is closed at the end."""
    reader, writer = await asyncio.open_unix_connection(sock=connection, limit=bounds.message_bytes)
    writer.transport.set_write_buffer_limits(high=0)  # a flush waits until the socket took the whole answer (_Flow)
    requests = _Requests(reader, bounds.message_bytes, writer.write)
    try:
        async with stdio_server(stdin=requests, stdout=_Answers(writer.write, writer.drain)) as (reads, writes):  # type: ignore[arg-type]
            draining = _Draining(reads, writes, bounds.requests)
            yield draining, draining.writes
    finally:
        writer.transport.abort()  # at once: whatever the session still had to say was said (_Draining)


@asynccontextmanager
async def _sdk_streams(limit: int) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's streams, over the event loop's pipe transports where stdin and stdout are pipes or sockets."""
    if not (is_pipe(0) and is_pipe(1)):
        async with stdio_server() as streams:
            yield streams
        return
    loop = asyncio.get_running_loop()
    with _claimed() as (wire_in, wire_out):
        reader = asyncio.StreamReader(limit=limit)
        reading, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), wire_in)
        try:
            writing, flow = await loop.connect_write_pipe(_Flow, wire_out)
            try:
                answers, requests = _Answers(writing.write, flow.ready.wait), _Requests(reader, limit, writing.write)
                async with stdio_server(stdin=requests, stdout=answers) as streams:  # type: ignore[arg-type]
                    yield streams
            finally:
                writing.close()
        finally:
            reading.close()


@contextmanager
def _claimed() -> Iterator[tuple[Any, Any]]:
    """Private duplicates of fds 0 and 1 as binary files, fd 0 on the null device and fd 1 on stderr meanwhile."""
    saved = os.dup(0), os.dup(1)
    wire = open(os.dup(0), "rb", buffering=0), open(os.dup(1), "wb", buffering=0)  # noqa: SIM115 (the transports close them)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire
    finally:
        os.close(null)
        for fd, copy in enumerate(saved):
            os.dup2(copy, fd)
            os.close(copy)
        for file in wire:
            file.close()


class _Requests:
    """The requests, one JSON-RPC message a line, as the SDK's reader iterates them. A line longer than ``limit``
    bytes is dropped as it arrives, keeping only its ends, and answered through ``refuse`` with an error naming the
    limit (module docstring); the reader's buffer, bounded by the same limit, is all it ever holds of it."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, refuse: Callable[[bytes], None]) -> None:
        self._reader, self._limit, self._refuse = reader, limit, refuse

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:  # the end of the stream (a last line without its newline)
                line = end.partial
            except asyncio.LimitOverrunError as overrun:
                await self._skip(overrun.consumed)
                continue
            if not line:
                raise StopAsyncIteration
            return line.decode("utf-8", errors="replace")

    async def _skip(self, buffered: int) -> None:
        """Drop the line too long whose first ``buffered`` bytes the reader holds, up to its end; then answer it."""
        head, tail, size = b"", b"", 0
        while True:
            while buffered:
                piece = await self._reader.read(min(buffered, PIECE))
                head, tail = head or piece[:ENDS], (tail + piece)[-ENDS:]
                size, buffered = size + len(piece), buffered - len(piece)
            try:
                rest = await self._reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as overrun:
                buffered = overrun.consumed
                continue
            except asyncio.IncompleteReadError as end:
                rest = end.partial
            self._refuse(too_long(head, (tail + rest)[-ENDS:], size + len(rest), self._limit))
            return


def too_long(head: bytes, tail: bytes, size: int, limit: int) -> bytes:
    """The error answer (a line) to a request of ``size`` bytes, over ``limit``, of which ``head`` and ``tail`` are
    the ends: to the request's id when either end shows it, else to a null id (what JSON-RPC answers a request whose id
    cannot be read)."""
    found = HEAD_ID.match(head) or TAIL_ID.search(tail.rstrip(b"\r\n"))
    request_id = None if found is None else json.loads(found.group(1))
    message = (
        f"this message has {size:,} bytes, more than a session may send in one (max_message_mb={limit // MB}: "
        f"{limit:,} bytes): it was not read, and nothing of it was applied. Send less in one call (a shorter "
        "trajectory or experience, fewer steps), or raise the max_message_mb setting of the server."
    )
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": INVALID_REQUEST, "message": message}}
    return json.dumps(error, separators=(",", ":")).encode() + b"\n"


class _Flow(asyncio.Protocol):
    """The write side's flow control: an answer's flush returns once the pipe took all of it.

    The transport writes at once whatever the pipe takes and buffers only the rest; with no buffer allowed (high
    water mark 0) it pauses while anything is buffered, so a flush waits while the client lags behind reading, and
    the last answer is on the wire before the transport closes (closing drops what it still buffers).
    """

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.set_write_buffer_limits(high=0)

    def pause_writing(self) -> None:
        self.ready.clear()

    def resume_writing(self) -> None:
        self.ready.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ready.set()


class _Answers:
    """Where the SDK's writer puts each answer: ``write``, then ``flush``, which returns once the transport took it."""

    def __init__(self, write: Callable[[bytes], None], flushed: Callable[[], Awaitable[Any]]) -> None:
        self._write, self._flushed = write, flushed

    async def write(self, text: str) -> None:
        self._write(text.encode())

    async def flush(self) -> None:
        await self._flushed()


class _Wrapped:
    """One of the SDK's streams, wrapped: closing the wrapper closes it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Draining(_Wrapped):
    """The read stream the SDK's session reads, which ends only once every request read from it is answered.

    It counts what crosses the wire: the ids of the client's requests not yet answered (an answer, or the client's
    ``notifications/cancelled``, settles one) and of the server's requests to the client not yet answered. At the
    end of stdin it first answers each of the server's open requests with a ``CONNECTION_CLOSED`` error, as the
    client would never answer them, and then ends once the client's requests are all answered, or at the latest
    ``DRAIN_SECONDS`` after the end of stdin (module docstring). A request read while ``most`` are not yet answered
    is answered at once with an error, and never reaches the session.
    """

    def __init__(self, reads: Any, writes: Any, most: int) -> None:
        super().__init__(reads)
        self.writes = _Written(writes, self)
        self._most = most
        self._asked: set[str | int] = set()  # the client's requests not yet answered
        self._asking: set[str | int] = set()  # the server's requests to the client not yet answered
        self._closed: set[str | int] = set()  # the server's requests answered here at the end of stdin
        self._changed = anyio.Event()
        self._deadline: float | None = None  # set at the end of stdin

    @property
    def last_context(self) -> Any:
        """The sender's context of the last message (the SDK's context-carrying streams have one)."""
        return getattr(self._inner, "last_context", None)

    def sent(self, message: Any) -> None:
        """Count a message the server writes."""
        if isinstance(message, JSONRPCResponse | JSONRPCError):
            self._asked.discard(message.id)
        elif isinstance(message, JSONRPCRequest):
            self._asking.add(message.id)
        else:
            return
        self._changed.set()
        self._changed = anyio.Event()

    async def receive(self) -> SessionMessage | Exception:
        while self._deadline is None:
            try:
                item: SessionMessage | Exception = await self._inner.receive()
            except anyio.EndOfStream:
                self._deadline = anyio.current_time() + DRAIN_SECONDS
                break
            refusal = _unreadable(item) if isinstance(item, Exception) else self._refusal(item)
            if refusal is not None:
                await self.writes.refuse(refusal)  # nothing is read meanwhile
            if refusal is not None or isinstance(item, Exception):  # an unparseable line reaches no session
                continue
            self._read(item)
            return item
        with anyio.CancelScope(deadline=self._deadline):
            while self._asked:
                unanswerable = self._asking - self._closed
                if unanswerable:
                    request_id = min(unanswerable, key=str)
                    self._closed.add(request_id)
                    error = ErrorData(code=CONNECTION_CLOSED, message="the client closed stdin")
                    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
                await self._changed.wait()
        raise anyio.EndOfStream

    def _refusal(self, item: SessionMessage | Exception) -> JSONRPCError | None:
        """The answer to a request the session must not see: one beyond ``most`` not yet answered, or one whose id
        a request not yet answered has (ids are the client's to keep apart: served, such requests were not counted)."""
        if not isinstance(item, SessionMessage) or not isinstance(item.message, JSONRPCRequest):
            return None
        request_id = item.message.id
        if request_id in self._asked:
            message = f"id {request_id!r} is the id of a request not yet answered: this one was not served"
        elif len(self._asked) >= self._most:
            message = (
                f"this session has {len(self._asked)} requests not yet answered, the most it may have "
                f"(max_requests_in_flight={self._most}): this one was not served. Wait for answers before sending more."
            )
        else:
            return None
        return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=INVALID_REQUEST, message=message))

    def _read(self, item: SessionMessage | Exception) -> None:
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if isinstance(message, JSONRPCRequest):
            self._asked.add(message.id)
        elif isinstance(message, JSONRPCResponse | JSONRPCError):
            self._asking.discard(message.id)
        elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            cancelled = (message.params or {}).get("requestId")
            if isinstance(cancelled, str | int):  # the client's to fill: a list would not hash
                self._asked.discard(cancelled)

    def __aiter__(self) -> _Draining:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


def _unreadable(error: Exception) -> JSONRPCError | None:
    """The answer to a line that the SDK's reader could not read as JSON (``error`` holds the line): a parse error,
    under the request's id when Python's own reader finds one (it takes a lone surrogate, which the SDK's refuses),
    else under ``null``, as JSON-RPC says. None for an empty line, for a notification or an answer (never answered),
    and for JSON that is no JSON-RPC message (the SDK's to refuse)."""
    problem = error.errors()[0] if isinstance(error, ValidationError) and error.errors() else None
    if problem is None or problem["type"] != "json_invalid" or not str(problem["input"]).strip():
        return None
    try:
        message = json.loads(problem["input"])
    except ValueError:
        text = f"not JSON: {problem['msg']}"
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message=text))
    request_id = message.get("id") if isinstance(message, dict) and "method" in message else None
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        return None
    try:
        json.dumps(message, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        text = "the request is not valid Unicode: a string of it holds a lone surrogate (such as \\ud800)"
    else:
        text = f"the request is not JSON the server reads: {problem['msg']}"
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=PARSE_ERROR, message=text))


class _Written(_Wrapped):
    """The write stream the SDK's session writes, each message counted by :class:`_Draining` as it is taken."""

    def __init__(self, writes: Any, draining: _Draining) -> None:
        super().__init__(writes)
        self._draining = draining

    async def send(self, item: SessionMessage) -> None:
        await self._inner.send(item)
        self._draining.sent(item.message)  # only once the writer took it: the session's end cancels what still sends

    async def refuse(self, refusal: JSONRPCError) -> None:
        """Answer a request the session never saw: not counted (the request it shares an id with stays open)."""
        await self._inner.send(SessionMessage(refusal))
