"""How every sandbox starts: its cgroups, an unprivileged identity, and (for a root filesystem) its layers.

A small launcher (the host's Python, ``-I -S``, stdlib only) runs as host root for a few steps, then becomes
nobody in particular and ``exec``s ``bwrap``:

1. it joins the sandbox's cgroups (:mod:`.cgroups`) and sets ``RLIMIT_RTPRIO`` (hard) and ``RLIMIT_CORE`` to 0
   and its death signal to SIGKILL;
2. in a private mount namespace it mounts a tmpfs of the disk limit on an empty host folder (the staging
   folder) and binds there read-only the host folders the sandbox may see (locked read-only: the sandbox's
   user namespace cannot remount them writable). With a root filesystem it binds that in too and mounts there
   the agent's overlay (upper and work directories on that tmpfs: every byte the agent writes counts against
   the disk limit and the memory cgroup, none lands on a host disk) and a read-only overlay of the untouched
   root (the "pristine" tree a checker runs from), from inside the tmpfs with relative paths, so
   ``/proc/self/mountinfo`` in the sandbox shows ``lowerdir=lower,upperdir=rw/upper``: no host folder;
3. it makes a user namespace mapping ids 0-65535 inside to ``BASE``-``BASE+65535`` outside (written by a
   forked helper that is still host root), and switches to uid 0 there. Root in the sandbox has every
   capability over what that namespace owns (its network, its files, its users: ``useradd``, ``chown`` and
   ``su`` work) and none over the host: a host file, sysctl or device is owned by an id it does not map.
   Root filesystems are therefore stored with their ids shifted by ``BASE`` (:func:`shift_ids`);
4. it ``exec``s ``bwrap`` (as root of that namespace, so bwrap keeps capabilities to build the rest).

``BASE`` (1,000,000) is above every real account and the usual ``/etc/subuid`` ranges of rootless containers.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from memrl_harness.backends.cgroups import ROOT, Cgroups, Limits
from memrl_harness.backends.sandbox import SandboxError

BASE = 1_000_000
IDS = 65536

_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

def ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if s else None
    ok(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUSER, PR_SET_PDEATHSIG = 0x20000, 0x10000000, 1
base, ids = cfg["base"], cfg["ids"]
for procs in cfg["cgroups"]:
    with open(procs, "w") as out:
        out.write(str(os.getpid()))
ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if cfg["staging"]:
    ok(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    tmpfs = f"size={cfg['disk_mb']}m,mode=0755,uid={base},gid={base}"
    mount("tmpfs", cfg["staging"], "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
    os.chdir(cfg["staging"])
for index, path in enumerate(cfg["binds"]):  # host folders the sandbox sees read-only (and locked so)
    os.mkdir(str(index))
    mount(path, str(index), None, MS_BIND | MS_REC)
    mount(None, str(index), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
if cfg["rootfs"]:
    for folder in ("lower", "empty", "rw", "rw/upper", "rw/work", "root", "pristine"):
        os.mkdir(folder)
        os.chown(folder, base, base)
    mount(cfg["rootfs"], "lower", None, MS_BIND | MS_REC)
    mount("overlay", "root", "overlay", MS_NODEV, "lowerdir=lower,upperdir=rw/upper,workdir=rw/work")
    mount("overlay", "pristine", "overlay", MS_NODEV | MS_RDONLY, "lowerdir=lower:empty")
os.chdir("/")
read_end, write_end = os.pipe()
helper = os.fork()
if helper == 0:  # still host root: writes the new namespace's id maps once the parent has made it
    os.close(write_end)
    os.read(read_end, 1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{os.getppid()}/{name}", "w") as out:
            out.write(f"0 {base} {ids}\n")
    os._exit(0)
os.close(read_end)
ok(libc.unshare(CLONE_NEWUSER), "unshare user namespace")
os.write(write_end, b"x")
os.close(write_end)
if os.waitpid(helper, 0)[1] != 0:
    sys.exit("the id maps could not be written")
os.setgroups([])
os.setresgid(0, 0, 0)
os.setresuid(0, 0, 0)
os.execv(cfg["argv"][0], cfg["argv"])  # no lookup: the stdlib may be out of reach now
"""


@dataclass(frozen=True)
class Staging:
    """Where the launcher mounts what bwrap then binds: a root filesystem's layers, ``root`` (the agent's
    overlay) and ``pristine`` (read-only, untouched), and read-only host folders (``bound(i)``), all inside
    ``folder`` (an empty host folder that only the sandbox's private mount namespace mounts over)."""

    folder: Path

    def bound(self, index: int) -> str:
        return str(self.folder / str(index))

    @property
    def root(self) -> str:
        return str(self.folder / "root")

    @property
    def pristine(self) -> str:
        return str(self.folder / "pristine")


def launch(
    bwrap_args: Sequence[str],
    cgroups: Cgroups,
    limits: Limits,
    *,
    staging: Staging | None = None,
    rootfs: Path | None = None,
    binds: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    text: bool = False,
) -> subprocess.Popen[Any]:
    """Start ``bwrap bwrap_args...`` through the launcher (see the module doc): with ``rootfs``, its layers
    are mounted in ``staging``; each of ``binds`` (host folders) is mounted read-only at ``staging.bound(i)``."""
    if (rootfs or binds) and staging is None:
        raise ValueError("a root filesystem or bound folders need a staging folder")
    config = {
        "base": BASE,
        "ids": IDS,
        "cgroups": cgroups.procs_files,
        "rootfs": str(rootfs) if rootfs else None,
        "staging": str(staging.folder) if staging else None,
        "binds": list(binds),
        "disk_mb": limits.disk_mb,
        "argv": [shutil.which("bwrap") or "bwrap", *bwrap_args],
    }
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(config)],
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        text=text,
        encoding="utf-8" if text else None,
    )


def require_jail() -> None:
    """Raise with what is missing for a jail here (``make sandbox`` installs bubblewrap and libseccomp)."""
    problems = []
    if shutil.which("bwrap") is None:
        problems.append("bwrap not found (apt-get install bubblewrap)")
    if os.geteuid() != 0:
        problems.append("it needs root (cgroups, id maps, mounts)")
    if not (ROOT / "memory" / "cgroup.procs").exists():
        problems.append(f"no cgroup v1 memory controller under {ROOT}")
    if problems:
        raise SandboxError("the bubblewrap jail is unavailable: " + "; ".join(problems) + " -- run `make sandbox`")


def ids_shifted(rootfs: Path) -> bool:
    """Whether ``rootfs`` is stored with its ids shifted by ``BASE`` (its top folder owned by ``BASE``)."""
    return rootfs.stat().st_uid == BASE


def shift_ids(rootfs: Path) -> None:
    """Add ``BASE`` to the owner and group of every file under ``rootfs`` (once; set-id bits, which a chown
    clears, are put back), so that root of the sandbox's user namespace owns its system."""
    if ids_shifted(rootfs):
        return
    for folder, dirs, files in os.walk(rootfs, topdown=False):
        for name in dirs + files:
            _shift(Path(folder) / name)
    _shift(rootfs)  # last: it marks the whole tree as done


def _shift(path: Path) -> None:
    info = path.lstat()
    if info.st_uid >= BASE:
        return
    os.lchown(path, info.st_uid + BASE, info.st_gid + BASE)
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(path, stat.S_IMODE(info.st_mode))


if __name__ == "__main__":  # `python -m memrl_harness.backends.jail ROOTFS`: what `make sandbox` runs
    shift_ids(Path(sys.argv[1]))
