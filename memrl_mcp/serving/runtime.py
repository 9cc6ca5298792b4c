"""Where a store's local memory server and its sessions meet, and what they say first: a private folder per store
under the user's runtime folder (its Unix socket, its locks, its log), the greeting exchanged on each connection
before the MCP session starts, and the identity of the installed code.

Both sides import this module: the local server (:mod:`memrl_mcp.serving.local`) and whoever attaches to it (the
stdio entry's relay, the hooks; :mod:`memrl_mcp.serving.attach`). It needs the standard library only, because the
attaching side must start in a few tens of milliseconds.

The folder of one store is ``<runtime_dir>/<first 16 hex digits of SHA-256(the store's resolved path)>``, made
0700; a folder that is a symbolic link, belongs to another user or lets anyone else in is refused, never repaired
(another user could have made it to catch the sessions). Inside:

- ``socket``: the server's Unix socket (0600), bound under a temporary name and renamed into place, so a socket left
  by a crash is replaced at once and a session never meets a half-made one;
- ``owner.lock``: held (``flock``, exclusive) by the server for its whole life. The kernel drops the lock with the
  process, however it ends, so a lock left by a crash never blocks anything; "a server runs" means "this lock is
  held", never a pid written in a file;
- ``start.lock``: held by whoever starts a server, until the server holds ``owner.lock``: sessions starting at the
  same moment start one server between them;
- ``server.log``: the last server's stderr (why it could not start, when it could not).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import memrl_mcp
from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError
from memrl_mcp.folders import default_runtime_dir

PROTOCOL = 1  # of the greeting below; a change of its fields is a new number
GREETING_LIMIT = 1 << 20  # bytes of one greeting line (a session's environment fits many times over)
MAX_SOCKET_PATH = 100  # a Unix socket's path: 108 bytes on Linux, 104 on macOS, with the final NUL
Kind = Literal["session", "status", "stop"]


class AttachError(MemrlError):
    """No local server could be reached, started or used; the message says why and what to do."""


@dataclass(frozen=True)
class Place:
    """The private folder of one store's local server (module docstring)."""

    folder: Path

    @property
    def socket(self) -> Path:
        return self.folder / "socket"

    @property
    def owner_lock(self) -> Path:
        return self.folder / "owner.lock"

    @property
    def start_lock(self) -> Path:
        return self.folder / "start.lock"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"


def place_of(data_dir: Path, runtime_dir: Path | None = None) -> Place:
    """The folder of the store at ``data_dir``'s local server, made private if missing (module docstring)."""
    store = os.path.realpath(data_dir)
    root = Path(os.path.abspath(runtime_dir or default_runtime_dir()))
    private_folder(root)
    place = Place(root / hashlib.sha256(store.encode()).hexdigest()[:16])
    private_folder(place.folder)
    if len(os.fsencode(place.socket)) > MAX_SOCKET_PATH:
        raise AttachError(
            f"the local server's socket {place.socket} is longer than a Unix socket's path may be "
            f"({MAX_SOCKET_PATH} bytes): set runtime_dir (MEMRL_RUNTIME_DIR) to a shorter folder"
        )
    return place


def private_folder(path: Path) -> None:
    """Make ``path`` (0700) unless it exists; refuse one that only its owner, this user, cannot enter alone."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise AttachError(f"cannot make the local server's folder {path}: {error.strerror}") from None
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise AttachError(f"{path} should be the local server's folder but is not a folder: remove it")
    if found.st_uid != os.getuid():
        raise AttachError(
            f"{path} belongs to another user (uid {found.st_uid}), who could listen in place of the memory server: "
            "remove it, or set runtime_dir (MEMRL_RUNTIME_DIR) to a folder of your own"
        )
    if found.st_mode & 0o077:
        raise AttachError(
            f"{path} lets other users in (mode {stat.S_IMODE(found.st_mode):o}): chmod 700 it, or remove it"
        )


@contextmanager
def flocked(path: Path, shared: bool = False) -> Iterator[bool]:
    """Try to lock ``path`` (made 0600 if missing) without waiting: True while held, False when another has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the only descriptor of the file drops its lock


def owner_running(place: Place) -> bool:
    """Whether a server holds the store's ``owner.lock`` (it may be starting, serving or stopping)."""
    with flocked(place.owner_lock, shared=True) as free:
        return not free


def build_identity() -> str:
    """The installed code, as a short digest of the package's files (their paths, sizes and modification times): a
    session and a server whose code differs in any file, even under one version number, do not share a store."""
    root = Path(memrl_mcp.__file__).parent
    digest = hashlib.sha256(__version__.encode())
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(name for name in folders if name != "__pycache__")
        for name in sorted(files):
            found = os.stat(os.path.join(folder, name))
            relative = os.path.relpath(os.path.join(folder, name), root)
            digest.update(f"{relative}\0{found.st_size}\0{found.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Hello:
    """What the attaching side says first: who it is, and the session's own settings as a process of its own would
    read them (its environment, config file, store and working folder)."""

    kind: Kind
    version: str
    build: str
    pid: int
    data_dir: str
    config: str | None = None
    cwd: str = "/"
    environ: dict[str, str] = field(default_factory=dict)
    protocol: int = PROTOCOL


@dataclass(frozen=True)
class Answer:
    """The server's answer to a :class:`Hello`. ``ok``: the MCP session starts on this connection (``session``) or
    the request was done (``status``, ``stop``); else ``message`` says why not, and ``retry`` that the server is
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


def read_line(connection: socket.socket, limit: int = GREETING_LIMIT) -> bytes:
    """One line from ``connection``, taking nothing beyond its newline (what follows is the MCP session's)."""
    line = b""
    while True:
        peeked = connection.recv(min(65536, limit + 1 - len(line)), socket.MSG_PEEK)
        if not peeked:
            raise ConnectionError("the other side closed the connection")
        end = peeked.find(b"\n")
        line += connection.recv(len(peeked) if end < 0 else end + 1)
        if end >= 0:
            return line
        if len(line) > limit:
            raise ValueError(f"a greeting is at most {limit} bytes")


def peer_uid(connection: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket, from the kernel (Linux ``SO_PEERCRED``, macOS
    ``LOCAL_PEERCRED``); None where neither exists."""
    if hasattr(socket, "SO_PEERCRED"):
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", credentials)[1])
    if sys.platform == "darwin" and hasattr(socket, "LOCAL_PEERCRED"):
        credentials = connection.getsockopt(0, socket.LOCAL_PEERCRED, struct.calcsize("IIh16I"))  # struct xucred
        return int(struct.unpack_from("II", credentials)[1])
    return None


def connect_socket(path: Path, timeout: float) -> socket.socket | None:
    """A connection to the Unix socket at ``path``; None when nothing listens there (no file, or one a dead
    server left)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(timeout)
    try:
        connection.connect(os.fspath(path))
    except (FileNotFoundError, ConnectionRefusedError):
        connection.close()
        return None
    except OSError:
        connection.close()
        raise
    return connection


def greet(connection: socket.socket, hello: Hello) -> Answer | None:
    """Send ``hello`` and read the server's answer; None when the server closed first (it is going away)."""
    try:
        connection.sendall(encode(hello))
        return decode(Answer, read_line(connection))
    except (ConnectionError, BrokenPipeError):
        return None
