"""Another local user, performed: the suite runs as root, and ``nobody`` (uid 65534, no groups, through
``setpriv``) tries to list every folder and read every file a test made, with the system's Python (this suite's may
live where nobody can enter), looking for a secret planted in them.

The folder a test works in must let nobody in (:func:`open_folder`, checked): pytest's ``tmp_path`` sits under
folders of mode 0700, where nobody is refused whatever the store's own modes, and a test there would pass for the
wrong reason."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
ATTEMPT = """
import json, sys
entries, secret = json.loads(sys.argv[1]), sys.argv[2].encode()
got = {"listed": [], "read": [], "found": []}
for path, kind in entries:
    try:
        if kind == "folder":
            __import__("os").listdir(path)
            got["listed"].append(path)
        else:
            with open(path, "rb") as stream:
                data = stream.read()
            got["read"].append(path)
            if secret in data:
                got["found"].append(path)
    except OSError:
        pass
print(json.dumps(got))
"""


def as_nobody(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_NOBODY, *command], capture_output=True, text=True, timeout=60, cwd="/")


def system_python() -> str:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python is not None, "the system's python3 is missing (apt-get install -y python3)"
    return python


def entries_under(*roots: Path) -> list[tuple[str, str]]:
    """Every folder and file under ``roots`` (the roots too), as this process (root) sees them."""
    found: list[tuple[str, str]] = []
    for root in roots:
        if root.is_file():
            found.append((str(root), "file"))
            continue
        found.append((str(root), "folder"))
        for folder, folders, files in os.walk(root):
            found += [(os.path.join(folder, name), "folder") for name in folders]
            found += [(os.path.join(folder, name), "file") for name in files]
    return found


def what_nobody_gets(secret: str, *roots: Path) -> dict[str, list[str]]:
    """What nobody lists, reads, and finds the secret in, of every entry under ``roots``."""
    entries = entries_under(*roots)
    assert entries, f"nothing under {roots}"
    done = as_nobody(system_python(), "-I", "-c", ATTEMPT, json.dumps(entries), secret)
    assert done.returncode == 0, done.stderr
    got: dict[str, list[str]] = json.loads(done.stdout)
    return got


def holding(secret: str, *roots: Path) -> list[str]:
    """The files under ``roots`` that hold the secret, read as root: what an attacker would be after."""
    return [
        path for path, kind in entries_under(*roots) if kind == "file" and secret.encode() in Path(path).read_bytes()
    ]


def not_private(*roots: Path) -> list[str]:
    """Every folder or file under ``roots`` with a group or other bit set, with its mode."""
    found = []
    for path, _ in entries_under(*roots):
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & 0o077:
            found.append(f"{path} {mode:04o}")
    return found


def open_up(*roots: Path) -> None:
    """Give every folder and file under ``roots`` to everyone to read (0755 / 0644), as a store made with an open
    umask (by an earlier version) is."""
    for path, kind in entries_under(*roots):
        os.chmod(path, 0o755 if kind == "folder" else 0o644)


@contextmanager
def open_folder(name: str) -> Iterator[Path]:
    """A new folder of mode 0755 under /tmp (1777), which nobody may enter and list: checked, so that what a test
    makes in it is protected by its own modes or not at all."""
    folder = Path(tempfile.mkdtemp(prefix=f"memrl-{name}-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        (folder / "probe").write_text("anyone may read this")
        (folder / "probe").chmod(0o644)
        listed = as_nobody(system_python(), "-I", "-c", "import os, sys; print(os.listdir(sys.argv[1]))", str(folder))
        assert listed.returncode == 0 and "probe" in listed.stdout, f"nobody cannot enter {folder}: {listed.stderr}"
        assert as_nobody("cat", str(folder / "probe")).stdout == "anyone may read this"
        (folder / "probe").unlink()
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
