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
- ``server.log``: the last server's stderr (why it could not start, when it could not).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import memrl_mcp
from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError
from memrl_mcp.folders import default_runtime_dir

MAX_SOCKET_PATH = 100  # a Unix socket's path: 108 bytes on Linux, 104 on macOS, with the final NUL


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
