"""What finding a session's project costs (memrl_mcp/projects.py: the git repository its folder is in, read from the
files). The server derives it once per connection, and each of the Claude Code plugin's hooks is a connection of its
own (a fresh process per event): so once per hook event. Folders of real repositories made by git:

- **top**: the repository's top folder (one ``.git`` folder found);
- **subfolder, 4 deep**: ``src/a/b/c`` of it (four folders up);
- **worktree**: a linked worktree (its ``.git`` file, the worktree's record in the repository, both checked);
- **no repository, 8 deep**: a folder outside any repository, eight folders below the run's temporary folder (up to
  the root of the filesystem, or to its mount point);
- **folder URI only**: what the namespace cost before (:func:`~memrl_mcp.projects.project_namespace` of the URI).

Kinds alternate call by call, so that a change of the machine's load falls on all of them alike.

    /work/main/.venv/bin/python perf/project_detection.py            # 5 runs of 2000 calls of each
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

from memrl_mcp.projects import folder_uri, project_namespace, project_of

GIT = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, env={**os.environ, **GIT}, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="projects-"))
    try:
        top = work / "code" / "proj"
        top.mkdir(parents=True)
        git(top, "init", "-q")
        git(top, "commit", "-q", "--allow-empty", "-m", "first")
        deep = top / "src" / "a" / "b" / "c"
        deep.mkdir(parents=True)
        git(top, "worktree", "add", "-q", str(work / "code" / "proj-feature"))
        plain = work.joinpath(*"abcdefgh")
        plain.mkdir(parents=True)
        kinds: dict[str, Callable[[], object]] = {
            "top": lambda: project_of(folder_uri(top)),
            "subfolder, 4 deep": lambda: project_of(folder_uri(deep)),
            "worktree": lambda: project_of(folder_uri(work / "code" / "proj-feature")),
            "no repository, 8 deep": lambda: project_of(folder_uri(plain)),
            "folder URI only": lambda: project_namespace(folder_uri(deep)),
        }
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.runs):
            for kind, find in kinds.items():
                started = time.perf_counter()
                for _ in range(args.calls):
                    find()
                times[kind].append((time.perf_counter() - started) / args.calls * 1e6)
        where = f"{os.uname().sysname}, Python {sys.version.split()[0]}"
        print(f"{args.runs} runs of {args.calls} calls each ({where})")
        rows = [(kind, B.p50(values), min(values), max(values)) for kind, values in times.items()]
        print(B.table(("folder", "median µs a call", "min µs", "max µs"), rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
