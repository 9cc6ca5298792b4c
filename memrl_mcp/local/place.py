"""Where a store's local memory server and its sessions meet: a private folder per store under the user's runtime
folder (its Unix socket, its locks, its log), and the identity of the installed code.

Both sides of the rendezvous use this module: the local server (:mod:`memrl_mcp.local.server`) and whoever attaches
to it (:mod:`memrl_mcp.local.attach`: the stdio entry's relay, the hooks). It needs the standard library only,
because the attaching side must start in a few tens of milliseconds. What the two say first on a connection is
:mod:`memrl_mcp.local.greeting`.

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
- ``server.log``: the last server's stderr (why it could not start, when it could not);
- ``hooks/``: the hooks' records of their sessions (:mod:`memrl_mcp.clients.core`).

What is checked is what is used. The runtime folder and the store's folder are each opened (``O_DIRECTORY |
O_NOFOLLOW``) and checked through the descriptor (``fstat``), and everything in them is reached through that
descriptor, never through the path again (:meth:`Place.opened`): another user who can rename folders on the way (a
runtime folder under a folder open to all, an ``XDG_RUNTIME_DIR`` of another user) and swaps a folder of their own
in between the check and the use gains nothing. A Unix socket has no ``connectat``: on Linux its path runs through
the descriptor (``/proc/self/fd/N/socket``, which the kernel resolves through the folder opened, wherever it has been
moved). Elsewhere (macOS) the socket is reached by its path: the server then checks through the descriptor that the
socket it bound is in the folder it checked, and on every platform whoever connects asks the kernel who listens
(:func:`peer_uid`) and refuses another user's socket before sending a byte.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import memrl_mcp
from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError
from memrl_mcp.folders import default_runtime_dir

MAX_SOCKET_PATH = 100  # a Unix socket's path: 108 bytes on Linux, 104 on macOS, with the final NUL
THROUGH_DESCRIPTORS = os.path.isdir("/proc/self/fd")  # Linux: a path that the kernel resolves through a descriptor
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SOCKET, OWNER_LOCK, START_LOCK, LOG, HOOKS = "socket", "owner.lock", "start.lock", "server.log", "hooks"
WEIGHTS = os.path.join("embeddings", "models")  # of the package: the embedder's files, pinned by their digests


class AttachError(MemrlError):
    """No local server could be reached, started or used; the message says why and what to do."""


@dataclass(frozen=True)
class Folder:
    """A folder opened and checked (:meth:`Place.opened`): its path as named, for messages, and its descriptor, for
    every use."""

    path: Path
    fd: int

    def through(self, name: str) -> str:
        """A path to ``name`` in this folder that the kernel resolves through the descriptor, on Linux; elsewhere
        the folder's path and the name (module docstring)."""
        return f"/proc/self/fd/{self.fd}/{name}" if THROUGH_DESCRIPTORS else os.fspath(self.path / name)

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """A file of this folder (made ``mode`` if ``flags`` create it), never through a symbolic link."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)


@dataclass(frozen=True)
class Place:
    """The private folder of one store's local server (module docstring); its paths name things in messages, and
    :meth:`opened` reaches them."""

    folder: Path

    @property
    def socket(self) -> Path:
        return self.folder / SOCKET

    @property
    def log(self) -> Path:
        return self.folder / LOG

    @contextmanager
    def opened(self, *inner: str) -> Iterator[Folder]:
        """The store's folder (or a folder ``inner`` it, such as ``hooks``), each folder from the runtime folder on
        made private if missing, opened and checked (module docstring): an :class:`AttachError` says which is
        wrong and what to do. The descriptors are closed at the end."""
        opened: list[int] = []
        try:
            path = self.folder.parent
            opened.append(_private_folder(None, path))
            for name in (self.folder.name, *inner):
                path = path / name
                opened.append(_private_folder(opened[-1], path))
            yield Folder(path, opened[-1])
        finally:
            for fd in opened:
                os.close(fd)


def place_of(data_dir: Path, runtime_dir: Path | None = None) -> Place:
    """The folder of the store at ``data_dir``'s local server, made private if missing and checked (module
    docstring)."""
    store = os.path.realpath(data_dir)
    root = Path(os.path.abspath(runtime_dir or default_runtime_dir()))
    place = Place(root / hashlib.sha256(store.encode()).hexdigest()[:16])
    with place.opened():
        pass
    if not THROUGH_DESCRIPTORS and len(os.fsencode(place.socket)) > MAX_SOCKET_PATH:
        raise AttachError(
            f"the local server's socket {place.socket} is longer than a Unix socket's path may be "
            f"({MAX_SOCKET_PATH} bytes): set runtime_dir (MEMRL_RUNTIME_DIR) to a shorter folder"
        )
    return place


def _private_folder(parent: int | None, path: Path) -> int:
    """``path`` (the name ``path.name`` in the folder ``parent``, when given) made 0700 unless it exists, then opened
    and checked: a folder, this user's, no one else let in; its descriptor."""
    name = os.fspath(path) if parent is None else path.name
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as error:
        raise AttachError(f"cannot make the local server's folder {path}: {error.strerror}") from None
    try:
        fd = os.open(name, FOLDER_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):  # a symbolic link, a file
            raise AttachError(f"{path} should be the local server's folder but is not a folder: remove it") from None
        raise AttachError(f"cannot open the local server's folder {path}: {error.strerror}") from None
    found = os.fstat(fd)
    problem = ""
    if found.st_uid != os.getuid():
        problem = (
            f"{path} belongs to another user (uid {found.st_uid}), who could listen in place of the memory server: "
            "remove it, or set runtime_dir (MEMRL_RUNTIME_DIR) to a folder of your own, in folders no other user "
            "can write to"
        )
    elif found.st_mode & 0o077:
        problem = f"{path} lets other users in (mode {stat.S_IMODE(found.st_mode):o}): chmod 700 it, or remove it"
    if problem:
        os.close(fd)
        raise AttachError(problem)
    return fd


@contextmanager
def flocked(place: Place, name: str, shared: bool = False) -> Iterator[bool]:
    """Try to lock the file ``name`` of ``place`` (made 0600 if missing) without waiting: True while held, False
    when another has it."""
    with place.opened() as folder:
        fd = folder.open(name, os.O_RDWR | os.O_CREAT)
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
    with flocked(place, OWNER_LOCK, shared=True) as free:
        return not free


def peer_uid(connection: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket, from the kernel (Linux ``SO_PEERCRED``, macOS
    ``LOCAL_PEERCRED``); None where neither exists. For the connecting side, the user who made the socket listen."""
    if hasattr(socket, "SO_PEERCRED"):
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", credentials)[1])
    if sys.platform == "darwin" and hasattr(socket, "LOCAL_PEERCRED"):
        credentials = connection.getsockopt(0, socket.LOCAL_PEERCRED, struct.calcsize("IIh16I"))  # struct xucred
        return int(struct.unpack_from("II", credentials)[1])
    return None


def build_identity() -> str:
    """The installed code, as a short digest of the package's files (their paths and contents): a session and a
    server whose code differs in any file, even under one version number, do not share a store, and two installs of
    the same code (a Desktop bundle and a ``uv tool install`` of one wheel, each with its own files' times) do. The
    embedder's weights are left out: :data:`~memrl_mcp.embeddings.minilm.MINILM_FILES` pins their SHA-256 in code
    that is hashed, and the embedder checks them as it loads (hashing them would cost every hook most of this;
    docs/performance.md)."""
    root = Path(memrl_mcp.__file__).parent
    digest = hashlib.sha256(__version__.encode())
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(name for name in folders if name != "__pycache__")
        relative_folder = os.path.relpath(folder, root)
        if relative_folder == WEIGHTS or relative_folder.startswith(WEIGHTS + os.sep):
            continue
        for name in sorted(files):
            with open(os.path.join(folder, name), "rb") as stream:
                contents = hashlib.sha256(stream.read()).digest()
            digest.update(os.path.join(relative_folder, name).encode() + b"\0" + contents)
    return digest.hexdigest()[:16]
