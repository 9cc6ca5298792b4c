"""Who may read an embedded store: the user who owns it, nobody else.

A store's files hold every memory in clear (the write-ahead log, the payload pages, the counts per namespace), the
memories of every tenant an HTTP server keeps apart with tokens included; a folder another user can enter gives them
all away. So every folder of a store is 0700 and every file 0600, whatever made it:

- before an engine opens the store (:func:`make_private`), each folder from ``data_dir`` down to the engine's is
  made if missing (0700), and ``data_dir`` and everything under the engine's folder is looked at: what this user owns
  with group or other bits set is made private, top down (a folder first: once it is closed nobody else can reach what
  is below it while the rest is done); what another user owns with such bits is refused, naming the ``chmod`` that
  fixes it, since this process may not fix it and must not write into a store others read;
- what the engine makes while the store is open follows the process's umask: every command of memrl-mcp runs with
  umask 077 (:mod:`memrl_mcp.cli`), so it is private from birth; an application opening a store through the Python
  API keeps its own umask, so what the engine makes meanwhile lies in folders no other user can enter, and is made
  private at the close (:func:`seal`) or at the next open.

A read-only open (an export, the ``read_only`` profile) reads the store and serves a private copy: it makes this
user's store private too where its volume allows, and only warns about another user's open store, whose files anyone
could read anyway and into which it writes nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path

from memrl_mcp.errors import MemrlError

OTHERS = 0o077  # the group and other bits: none may be set on a store's folder or file
SHOWN = 3  # entries named in a message
POSIX = os.name == "posix"
log = logging.getLogger(__name__)


class StoreNotPrivateError(MemrlError):
    """The store is open to other users and belongs to another user: this process may not make it private."""


def make_private(data_dir: Path, folder: Path, read_only: bool = False) -> None:
    """Make the store of ``data_dir`` whose engine keeps ``folder`` private before the engine opens it (module
    docstring): the missing folders from ``data_dir`` down to ``folder`` made 0700 (not for ``read_only``, which
    creates nothing), this user's entries made private, another user's open ones refused (``read_only``: warned
    about). Not on Windows, whose files have no such modes (a user's data folder is private by its ACLs)."""
    if not POSIX:
        return
    if not read_only:
        data_dir.parent.mkdir(parents=True, exist_ok=True)  # not the store's: as the umask has them
        for path in _chain(data_dir, folder):
            path.mkdir(mode=0o700, exist_ok=True)
    fixed, foreign, unchangeable = [], [], []
    for path, mode, owner in _entries(data_dir, folder):
        if not mode & OTHERS:
            continue
        if owner != os.geteuid():
            foreign.append((path, mode, owner))
            continue
        try:
            os.chmod(path, mode & ~OTHERS)
        except OSError as error:
            if error.errno != errno.EROFS or not read_only:
                raise
            unchangeable.append((path, mode, owner))
            continue
        fixed.append((path, mode, owner))
    fix = f"`chmod -R go= {shlex.quote(str(data_dir))}`"
    if foreign and not read_only:
        mine = shlex.quote(_user(os.geteuid()))
        raise StoreNotPrivateError(
            f"the memory store at {data_dir} is open to other users, and {len(foreign)} of its files and folders "
            f"belong to another user ({_named(foreign)}): this process changes no other user's files, and writes "
            f"nothing into a store others can read. Its owner can make it private with {fix} (or give it to this "
            f"user: `chown -R {mine} {shlex.quote(str(data_dir))}`), then start again"
        )
    if fixed:
        log.warning(
            "the memory store at %s was open to other users: %d of its files and folders made private (%s)",
            data_dir,
            len(fixed),
            _named(fixed),
        )
    if foreign or unchangeable:
        log.warning(
            "the memory store at %s is open to other users (%s), which this read-only open cannot change: %s makes "
            "it private",
            data_dir,
            _named(foreign + unchangeable),
            fix,
        )


def seal(folder: Path) -> None:
    """Make private what this user owns under ``folder`` (at a close: what the engine made with an open umask)."""
    if not POSIX:
        return
    for path, mode, owner in _tree(folder):
        if mode & OTHERS and owner == os.geteuid():
            os.chmod(path, mode & ~OTHERS)


def _entries(data_dir: Path, folder: Path) -> Iterator[tuple[Path, int, int]]:
    """``data_dir`` and each folder down to ``folder`` (followed if links: the user chose them), then every entry
    under ``folder``, top down; each with its mode and owner."""
    for path in _chain(data_dir, folder):
        try:
            found = path.stat()
        except FileNotFoundError:
            return
        yield path, stat.S_IMODE(found.st_mode), found.st_uid
    yield from _tree(folder, top=False)


def _chain(data_dir: Path, folder: Path) -> list[Path]:
    """``data_dir``, each folder below it down to ``folder``, and ``folder``."""
    parts = folder.relative_to(data_dir).parts
    return [data_dir.joinpath(*parts[:n]) for n in range(len(parts) + 1)]


def _tree(folder: Path, top: bool = True) -> Iterator[tuple[Path, int, int]]:
    """``folder`` (with ``top``) and every folder and file under it, top down, links left out (the engines make
    none); each with its mode and owner. A folder is yielded before it is listed."""
    if top:
        try:
            found = folder.stat()
        except FileNotFoundError:
            return
        yield folder, stat.S_IMODE(found.st_mode), found.st_uid
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for entry in entries:
        try:
            found = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(found.st_mode):
            continue
        path = Path(entry.path)
        yield path, stat.S_IMODE(found.st_mode), found.st_uid
        if stat.S_ISDIR(found.st_mode):
            yield from _tree(path, top=False)


def _named(entries: list[tuple[Path, int, int]]) -> str:
    shown = "; ".join(f"{path}: mode {mode:04o}, user {_user(owner)}" for path, mode, owner in entries[:SHOWN])
    return shown + (f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else "")


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
