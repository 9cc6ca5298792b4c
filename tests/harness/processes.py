"""Processes a harness test watches: the ones left alive by a marker in their command line, and throwaway
virtualenvs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def alive_processes(marker: str) -> list[int]:
    """Pids of the processes whose command line contains ``marker`` (for teardown checks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@contextmanager
def venv_under(parent: str) -> Iterator[Path]:
    """A virtualenv of this interpreter (no pip: the checks need the standard library) in a new folder under
    ``parent``, removed afterwards: the virtualenv's folder."""
    folder = Path(tempfile.mkdtemp(prefix="memrl-venv-", dir=parent))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
        yield folder / "venv"
    finally:
        shutil.rmtree(folder)
