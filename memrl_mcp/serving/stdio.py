"""The stdio transport, with the pipes read and written by the event loop itself.

The SDK's ``stdio_server`` reads each request line, writes each answer and flushes it through a worker thread
(anyio's ``AsyncFile``): three hand-offs to another thread and back per tool call. Here asyncio's pipe transports
read and write without blocking, on the loop; the SDK's ``stdio_server`` still parses and serialises every message.
A no-op tool cost its stdio server 0.95 ms of CPU per call through the SDK's transport, 0.63 ms through this one
(docs/performance.md). When stdin or stdout is not a pipe or a socket (a file, a terminal), the SDK's transport
serves instead.

Like the SDK's, it claims fds 0 and 1 while it serves: the wire is read and written through private duplicates,
fd 0 reads the null device and fd 1 writes to stderr, so that nothing else in the process (a child, a stray print)
reads the requests or writes into the answers; both are given back at the end.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from mcp.server.stdio import stdio_server

LINE_LIMIT = 1 << 30  # bytes of one message; the SDK's own reader has no limit


def is_pipe(fd: int) -> bool:
    """Whether ``fd`` is a pipe or a socket (what asyncio's pipe transports take)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's (read stream, write stream) over this process's stdin and stdout (module docstring)."""
    if not (is_pipe(0) and is_pipe(1)):
        async with stdio_server() as streams:
            yield streams
        return
    loop = asyncio.get_running_loop()
    with _claimed() as (wire_in, wire_out):
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        reading, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), wire_in)
        try:
            writing, flow = await loop.connect_write_pipe(_Flow, wire_out)
            try:
                async with stdio_server(stdin=_Requests(reader), stdout=_Answers(writing, flow)) as streams:  # type: ignore[arg-type]
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
    """The requests, one JSON-RPC message a line, as the SDK's reader iterates them."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _Flow(asyncio.Protocol):
    """The write side's flow control: an answer waits while the client lags behind reading the pipe."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()

    def pause_writing(self) -> None:
        self.ready.clear()

    def resume_writing(self) -> None:
        self.ready.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ready.set()


class _Answers:
    """Where the SDK's writer puts each answer: ``write``, then ``flush``."""

    def __init__(self, transport: asyncio.WriteTransport, flow: _Flow) -> None:
        self._transport, self._flow = transport, flow

    async def write(self, text: str) -> None:
        self._transport.write(text.encode())

    async def flush(self) -> None:
        await self._flow.ready.wait()
