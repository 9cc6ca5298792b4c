"""A project's namespace, from the root URI its client sends or from its folder: the project is the git repository
the folder is in (its top folder, shared by its worktrees), else the folder itself; its namespace is ``<slug of the
top folder's name>-<first 8 hex digits of SHA-256(its URI)>`` (``memrl-mcp-3fa9c2d1``), so one server attached to
several projects keeps their memories apart and two folders of the same name do not meet.

**Which repository** (:func:`repository_top`), read from the files, as git finds it but without running git (the
hooks are fresh processes at every event): from the folder up to the first ``.git`` (not across a mount point, as
git does not):

- a ``.git`` folder (with a ``HEAD``): its folder is the top;
- a ``.git`` file ``gitdir: <repo>/.git/worktrees/<name>`` (a linked worktree, ``git worktree add``): the top of
  the repository whose git folder that worktree's ``commondir`` names, the folder holding ``<repo>/.git`` (or the
  bare repository itself), **provided that repository's record of the worktree names this very ``.git`` file**
  (its ``gitdir`` file, which ``git worktree add`` writes and only the repository's owner can): otherwise any
  folder (an unpacked archive) could claim another project's namespace with a two-line file;
- any other ``.git`` file (a submodule, whose git folder is ``<superproject>/.git/modules/<name>``; a repository made
  with ``--separate-git-dir``): a repository of its own, its folder the top. A submodule has its own history and
  is often another project's code: its memory is its own, not the superproject's.

The top is named by its real path (symbolic links resolved), so that a worktree, which git records by its real
path, and the main checkout meet. Outside any repository the folder is the project, named as given.

**Today's namespaces stay reachable.** Before, the project was the folder a session started in: a session started
in ``proj/src``, or in a worktree, had that folder's namespace. :class:`Project` keeps it as ``earlier`` where it
differs from the repository's; the server lets the session reach it, and its recalls search it beside the
repository's (docs/tools.md, "Namespaces").

The standard library only: the Claude Code plugin's hooks (:mod:`memrl_mcp.clients.core`), fresh processes at each
prompt, build a folder's URI here; the server derives the project here (:func:`project_of`) from the roots a client
sends (:mod:`memrl_mcp.surface.roots`) or from the ``project_dir`` setting.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import quote, unquote, unquote_to_bytes, urlparse

SLUG_CHARS = 40
HASH_CHARS = 8
URI_SAFE = "/!$&'()*+,:;=@"
"""What Node's ``pathToFileURL`` (Claude Code's roots) leaves unescaped besides letters, digits and ``-._``."""
GIT_FILE_BYTES = 4096  # a .git file, commondir or gitdir is one line: a path
LOCAL_HOSTS = ("", "localhost")


@dataclass(frozen=True)
class Project:
    """A session's project: the namespace of its repository (or of its folder, outside any repository), and
    ``earlier``, the namespace its folder had before the project was its repository, where that differs."""

    namespace: str
    earlier: str | None = None


def project_namespace(uri: str) -> str:
    """``<slug of the root's last path component>-<first 8 hex digits of SHA-256(uri)>``: valid for
    :data:`~memrl_mcp.validation.NAMESPACE_PATTERN` (at most 49 characters of ``[A-Za-z0-9_.-]``)."""
    path = unquote(urlparse(uri).path).rstrip("/")
    name = unicodedata.normalize("NFKD", path.rsplit("/", 1)[-1]).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-.")[:SLUG_CHARS].strip("-.") or "project"
    return f"{slug}-{hashlib.sha256(uri.encode()).hexdigest()[:HASH_CHARS]}"


def folder_uri(folder: str | os.PathLike[str]) -> str:
    """The ``file://`` URI Claude Code sends as the root of a session opened in ``folder`` (Node's
    ``pathToFileURL(folder).href``, escaping included): the namespace is derived from this exact text."""
    path = "/" + os.path.normpath(os.path.abspath(folder)).lstrip("/")
    return "file://" + quote(os.fsencode(path), safe=URI_SAFE).replace("~", "%7E")


def project_of(uri: str, on_this_machine: bool = True) -> Project:
    """The project of a session whose root is ``uri`` (module docstring). ``on_this_machine``: the root names a
    folder of this machine (a client of stdio or of the local server; not one over HTTP, whose root may name a folder
    of another machine, and must not make the server look around its own disk)."""
    own = project_namespace(uri)
    folder = local_folder(uri) if on_this_machine else None
    top = None if folder is None else repository_top(folder)
    if top is None:
        return Project(own)
    namespace = project_namespace(folder_uri(top))
    return Project(namespace, None if namespace == own else own)


def local_folder(uri: str) -> str | None:
    """The absolute path a ``file://`` URI of this machine names (None: another scheme, or another host)."""
    parts = urlparse(uri)
    if parts.scheme != "file" or parts.netloc not in LOCAL_HOSTS or not parts.path.startswith("/"):
        return None
    return os.fsdecode(unquote_to_bytes(parts.path))


def repository_top(folder: str) -> str | None:
    """The top folder of the git repository ``folder`` is in, by its real path (module docstring); None outside any
    repository (or where the folder cannot be read)."""
    path = os.path.normpath(folder)
    try:
        device = os.stat(path).st_dev
    except OSError:
        return None
    while True:
        dot_git = os.path.join(path, ".git")
        if os.path.isfile(os.path.join(dot_git, "HEAD")):
            return os.path.realpath(path)
        if os.path.isfile(dot_git):
            return _linked_top(path, dot_git)
        parent = os.path.dirname(path)
        try:
            if parent == path or os.stat(parent).st_dev != device:  # the root, or a mount point: git stops too
                return None
        except OSError:
            return None
        path = parent


def _linked_top(folder: str, dot_git: str) -> str | None:
    """The top of the repository whose ``.git`` file is ``dot_git`` (module docstring): its main repository's for
    a linked worktree that repository records, else ``folder``'s own; None when the file is no git file."""
    line = _line(dot_git)
    if line is None or not line.startswith("gitdir:"):
        return None
    gitdir = os.path.join(folder, line.removeprefix("gitdir:").strip())
    common = _line(os.path.join(gitdir, "commondir"))
    if common is None:
        return os.path.realpath(folder)  # a submodule, or a separate git folder: a repository of its own
    common = os.path.realpath(os.path.join(gitdir, common))
    back = _line(os.path.join(gitdir, "gitdir"))
    recorded = os.path.dirname(os.path.realpath(gitdir)) == os.path.join(common, "worktrees")
    if not recorded or back is None or os.path.realpath(os.path.join(gitdir, back)) != os.path.realpath(dot_git):
        return os.path.realpath(folder)  # a worktree its repository does not record: it claims nobody else's memory
    return os.path.dirname(common) if os.path.basename(common) == ".git" else common


def _line(path: str) -> str | None:
    """The first line of a small file of git's, without its line break (None: there is none, or it cannot be read)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(GIT_FILE_BYTES)
    except OSError:
        return None
    text = os.fsdecode(head.split(b"\n", 1)[0].rstrip(b"\r"))
    return text or None
