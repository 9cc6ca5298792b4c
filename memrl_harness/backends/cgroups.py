"""Per-sandbox cgroups (v1, as on these machines): one memory limit, one process count limit and no real-time
CPU time for everything a sandbox runs, and a teardown that kills every process in it.

A sandbox's launcher writes its own pid into each group's ``cgroup.procs`` before it runs anything else, so every
descendant (double forks, ``setsid``, daemons) is counted and killed with it. The groups sit under the harness's
own group of each controller (a process already confined by its caller stays within that limit too). Nothing
inside a sandbox can leave its groups: no cgroup filesystem is mounted there and the host's is owned by host root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu", "freezer")
FLOORS = {"memory_mb": 32, "pids": 8, "disk_mb": 1}  # the least a sandbox may be given (:class:`Limits` refuses less)


class CgroupError(RuntimeError):
    """The cgroups could not be made (not cgroup v1, not root)."""


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use: memory (all its processes together, tmpfs pages included), processes and
    threads, and the size of its writable layer."""

    memory_mb: int = 1024
    pids: int = 256
    disk_mb: int = 512

    def __post_init__(self) -> None:
        for name, low in FLOORS.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")


def _own_group(controller: str) -> str:
    """This process's group of ``controller`` ('/' at the top), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    raise CgroupError(f"no cgroup v1 '{controller}' controller for this process (is this cgroup v1?)")


class Cgroups:
    """A sandbox's group in each controller; :meth:`destroy` kills what is left in it and removes it."""

    def __init__(self, limits: Limits, prefix: str = "memrl-sandbox") -> None:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.dirs: dict[str, Path] = {}
        try:
            for controller in CONTROLLERS:
                base = ROOT / controller
                if not (base / "cgroup.procs").exists():
                    raise CgroupError(f"{base} is not a cgroup v1 hierarchy (cgroup v1 with {controller} needed)")
                folder = base / _own_group(controller).lstrip("/") / name
                folder.mkdir()
                self.dirs[controller] = folder
            memory = limits.memory_mb << 20
            self._write("memory", "memory.limit_in_bytes", memory)
            with contextlib.suppress(FileNotFoundError):  # absent without swap accounting
                self._write("memory", "memory.memsw.limit_in_bytes", memory)
            self._write("pids", "pids.max", limits.pids)
            with contextlib.suppress(FileNotFoundError):  # absent without CONFIG_RT_GROUP_SCHED
                self._write("cpu", "cpu.rt_runtime_us", 0)
        except OSError as exc:
            self.destroy()
            raise CgroupError(f"cannot make the sandbox's cgroups (root and cgroup v1 needed): {exc}") from exc

    def _write(self, controller: str, file: str, value: int | str) -> None:
        (self.dirs[controller] / file).write_text(str(value))

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the launcher joins."""
        return [str(folder / "cgroup.procs") for folder in self.dirs.values()]

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (self.dirs["pids"] / "cgroup.procs").read_text().split()]
        return []

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL every process in the group, frozen first so that none can fork in between."""
        if "pids" not in self.dirs:
            return
        with contextlib.suppress(OSError):
            self._write("freezer", "freezer.state", "FROZEN")
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self._write("freezer", "freezer.state", "THAWED")  # killed tasks die only when thawed
            time.sleep(0.01)

    def destroy(self) -> None:
        """Kill what is left and remove the groups (idempotent)."""
        self.kill()
        for folder in self.dirs.values():
            for _ in range(200):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the last killed tasks are still leaving
                    time.sleep(0.01)
        self.dirs = {}
