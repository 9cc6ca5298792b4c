"""A minimal, synchronous MCP client of the local server, with the standard library alone: importing the MCP SDK's
client takes seconds on a small machine, and hooks and scripts run for a moment (a process per prompt)."""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from memrl_mcp import __version__
from memrl_mcp.local.attach import START_SECONDS, connect
from memrl_mcp.local.place import AttachError

HANDSHAKE_VERSION = "2025-11-25"  # the protocol LocalClient speaks (the newest of the handshake era)
CHUNK = 1 << 16


class ToolCallError(AttachError):
    """A tool call answered with an error: the tool refused it, or the request itself failed."""


@dataclass(frozen=True)
class ToolResult:
    """A tool's result as :class:`LocalClient` gets it: the structured content, and the text a model reads."""

    structured: dict[str, Any]
    text: str


class LocalClient:
    """A minimal, synchronous MCP client of the local server, for hooks and scripts that run for a moment (a
    process per prompt): :func:`~memrl_mcp.local.attach.connect`, the ``initialize`` handshake, then tool calls one
    after another.

        with LocalClient.open() as memory:
            found = memory.call_tool("recall_experience", {"task": "deploy the web app"})

    ``roots``: the project folders this client reports when the server asks (``file://`` URIs), so that its calls
    use that project's namespace as an editor's would. The server's other requests (elicitation, sampling) are
    declined: this client offers neither. ``deadline`` (``time.monotonic()``): the handshake and every call are
    answered by then, or fail, however slowly the server answers (a hook that must end in time); without one, each
    read waits as long as the connection's own timeout. A server that does not answer in time is an
    :class:`AttachError` that says so."""

    def __init__(
        self,
        connection: socket.socket,
        roots: Sequence[str] = (),
        name: str = "memrl-mcp-client",
        deadline: float | None = None,
    ) -> None:
        self._connection = connection
        self._deadline = deadline
        self._buffer = bytearray()
        self._roots = list(roots)
        self._ids = itertools.count(1)
        capabilities: dict[str, Any] = {"roots": {}} if self._roots else {}
        info = {"name": name, "version": __version__}
        handshake = {"protocolVersion": HANDSHAKE_VERSION, "capabilities": capabilities, "clientInfo": info}
        self._request("initialize", handshake)
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"}, "initialize")

    @classmethod
    def open(
        cls,
        data_dir: str | Path | None = None,
        *,
        start: bool = True,
        timeout: float = START_SECONDS,
        roots: Sequence[str] = (),
        name: str = "memrl-mcp-client",
    ) -> LocalClient:
        """A client of the local server of ``data_dir`` (:func:`~memrl_mcp.local.attach.connect`: the arguments mean
        the same)."""
        return cls(connect(data_dir, start=start, timeout=timeout), roots, name)

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The tool's structured result; :class:`ToolCallError` with the tool's message when it refused the call."""
        return self.call(name, arguments).structured

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """The tool's whole result: its structured content, and the text a model reads of it."""
        result = self._request("tools/call", {"name": name, "arguments": dict(arguments)})
        text = "\n".join(block.get("text", "") for block in result.get("content", []) if block.get("type") == "text")
        if result.get("isError"):
            raise ToolCallError(f"{name}: {text}")
        return ToolResult(result.get("structuredContent") or {}, text)

    def read_resource(self, uri: str) -> str:
        """The text of the resource at ``uri``; :class:`ToolCallError` with the server's message when it has none."""
        contents = self._request("resources/read", {"uri": uri}).get("contents") or [{}]
        text: str = contents[0].get("text", "")
        return text

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, message: Mapping[str, Any], method: str) -> None:
        self._in_time(method)
        try:
            self._connection.sendall(json.dumps(message).encode() + b"\n")
        except TimeoutError:
            raise AttachError(f"the local memory server did not take {method} in time") from None

    def _request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, method)
        while True:
            message = json.loads(self._line(method))
            if "method" in message and "id" in message:  # the server asks
                self._answer(message)
            elif message.get("id") == request_id:
                if "error" in message:
                    raise ToolCallError(f"{method}: {message['error'].get('message', message['error'])}")
                answer: dict[str, Any] = message.get("result") or {}
                return answer

    def _answer(self, request: Mapping[str, Any]) -> None:
        if request["method"] == "roots/list" and self._roots:
            reply: dict[str, Any] = {"result": {"roots": [{"uri": uri} for uri in self._roots]}}
        elif request["method"] == "ping":
            reply = {"result": {}}
        else:
            reply = {"error": {"code": -32601, "message": f"this client does not answer {request['method']}"}}
        self._send({"jsonrpc": "2.0", "id": request["id"], **reply}, str(request["method"]))

    def _line(self, method: str) -> bytes:
        """The server's next line, waiting at most until the deadline (class docstring)."""
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer)
            self._in_time(method)
            try:
                data = self._connection.recv(CHUNK)
            except TimeoutError:
                raise AttachError(f"the local memory server did not answer {method} in time") from None
            if not data:
                raise AttachError("the local memory server closed the connection")
            self._buffer += data
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        return line

    def _in_time(self, method: str) -> None:
        """The connection's timeout set to what is left before the deadline; AttachError when nothing is."""
        if self._deadline is None:
            return
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise AttachError(f"the local memory server did not answer {method} in time")
        self._connection.settimeout(left)
