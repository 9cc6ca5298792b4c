"""Real git repositories made by a test, as a user has them: a repository with a subfolder, a linked worktree
(``git worktree add``) and a submodule; git runs without the user's configuration (HOME is the test's)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Ann",
    "GIT_AUTHOR_EMAIL": "ann@example.org",
    "GIT_COMMITTER_NAME": "Ann",
    "GIT_COMMITTER_EMAIL": "ann@example.org",
}


def git(folder: Path, *args: str) -> str:
    """``git ARGS`` in ``folder``; its output."""
    env = {**os.environ, **GIT_ENV, "HOME": str(folder)}
    done = subprocess.run(["git", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def new_repository(folder: Path) -> Path:
    """``git init`` in ``folder`` (made), with one commit: what ``git worktree add`` and submodules need."""
    folder.mkdir(parents=True)
    git(folder, "init", "-q", "-b", "main")
    (folder / "README.md").write_text("# a project\n")
    git(folder, "add", "README.md")
    git(folder, "commit", "-q", "-m", "first")
    return folder


@dataclass(frozen=True)
class Repository:
    """A repository's top folder, a subfolder of it, a linked worktree of it and a submodule in it."""

    top: Path
    subfolder: Path
    worktree: Path
    submodule: Path


def repository_with_worktree(folder: Path) -> Repository:
    """A repository in ``folder`` with ``src/app``, a worktree beside it (``<folder>-feature``) and a submodule
    (``vendor/lib``, from a repository ``<folder>-lib``)."""
    top = new_repository(folder)
    subfolder = top / "src" / "app"
    subfolder.mkdir(parents=True)
    worktree = folder.with_name(f"{folder.name}-feature")
    git(top, "worktree", "add", "-q", "-b", "feature", str(worktree))
    library = new_repository(folder.with_name(f"{folder.name}-lib"))
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/lib")
    return Repository(top, subfolder, worktree, top / "vendor" / "lib")
