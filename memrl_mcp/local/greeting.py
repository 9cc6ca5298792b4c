"""What the two sides of the local server's rendezvous say first on each connection, before the MCP session starts:
the attaching side's :class:`Hello` (who it is, and the session's own settings) and the server's :class:`Answer`, one
JSON line each. The standard library only, like both sides' light halves."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Literal, TypeVar

PROTOCOL = 1  # of the greeting below; a change of its fields is a new number
GREETING_LIMIT = 1 << 20  # bytes of one greeting line (a session's settings' variables fit many times over)
Kind = Literal["session", "status", "stop", "http"]


@dataclass(frozen=True)
class Hello:
    """What the attaching side says first: who it is, and the session's own settings as a process of its own would
    read them (the variables of its environment the settings read, its config file, store and working folder)."""

    kind: Kind
    version: str
    build: str
    pid: int
    data_dir: str
    config: str | None = None
    cwd: str = "/"
    environ: dict[str, str] = field(default_factory=dict)
    host: str = ""  # ``http``: where the server is to serve streamable HTTP for as long as this connection is open
    port: int = 0
    protocol: int = PROTOCOL


@dataclass(frozen=True)
class Answer:
    """The server's answer to a :class:`Hello`. ``ok``: the MCP session starts on this connection (``session``),
    the server serves streamable HTTP until the connection closes (``http``), or the request was done (``status``,
    ``stop``); else ``message`` says why not, and ``retry`` that the server is
    going away for this very session (a restart to another version or other settings): connect again."""

    ok: bool
    version: str
    build: str
    pid: int
    message: str = ""
    retry: bool = False
    data_dir: str = ""
    sessions: int = 0
    ui: str = ""
    started: float = 0.0
    protocol: int = PROTOCOL


def encode(record: Hello | Answer) -> bytes:
    return json.dumps(dataclasses.asdict(record)).encode() + b"\n"


Greeting = TypeVar("Greeting", Hello, Answer)


def decode(kind: type[Greeting], line: bytes) -> Greeting:
    """A :class:`Hello` or :class:`Answer` from its line; ValueError when it is not one (a stranger, another
    protocol)."""
    try:
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("protocol") != PROTOCOL:
            raise ValueError(f"not a memrl-mcp greeting of protocol {PROTOCOL}")
        names = {item.name for item in dataclasses.fields(kind)}
        return kind(**{key: value for key, value in data.items() if key in names})
    except (TypeError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a memrl-mcp greeting: {error}") from None


def read_line(connection: socket.socket, limit: int = GREETING_LIMIT, deadline: float | None = None) -> bytes:
    """One line from ``connection``, taking nothing beyond its newline (what follows is the MCP session's); with a
    ``deadline`` (``time.monotonic()``), all of it by then, or TimeoutError, however slowly its bytes come."""
    line = b""
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no whole line in time")
            connection.settimeout(left)
        peeked = connection.recv(min(65536, limit + 1 - len(line)), socket.MSG_PEEK)
        if not peeked:
            raise ConnectionError("the other side closed the connection")
        end = peeked.find(b"\n")
        line += connection.recv(len(peeked) if end < 0 else end + 1)
        if end >= 0:
            return line
        if len(line) > limit:
            raise ValueError(f"a greeting is at most {limit} bytes")
