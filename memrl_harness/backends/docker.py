"""The Docker backends (``--option backend=docker``): llb-os in a container of LLB's OS image, llb-db on MariaDB
in a container; both images are built on this machine by ``make docker`` (docker/build.sh), nothing is pulled.

Why the Docker SDK for Python (``memrl-mcp[docker]``) and not the ``docker`` program: one HTTP request per call on
the engine's socket instead of a client process each, exit codes and demultiplexed output as values, and the
engine's errors as exceptions (``docker.errors``) rather than text to parse. It has no exec timeout: the
timeouts are enforced inside the container by a shell the agent cannot replace (below), the SDK's socket
timeout (:data:`CLIENT_TIMEOUT`) only guards against a hung engine.

:class:`DockerSandbox` (the :class:`~memrl_harness.backends.sandbox.Sandbox` protocol), one container per episode:

- no network at all (``--network none``: not even the host's 127.0.0.1), its own PID, IPC, UTS and mount
  namespaces; ``/proc/sys``, ``/sys`` and the kernel's other knobs read-only (Docker's default, which holds
  here because no capability able to remount them is kept); Docker's default seccomp profile (Debian's engine
  20.10 still allows ``io_uring_setup`` and ``AF_VSOCK`` sockets: docs/security.md);
- every capability dropped but the few a shell task uses (:data:`CAPABILITIES`: files, users, signals) and
  ``no-new-privileges``; no real-time scheduling (no ``CAP_SYS_NICE``, ``RLIMIT_RTPRIO`` 0, and the cgroup's
  real-time budget is 0);
- a memory limit covering all its processes and its tmpfs (``memory``, no swap beyond it), a process limit
  (``pids``); ``/tmp`` and ``/var/tmp`` are tmpfs of ``tmp_size`` each. The rest of the file system is the
  container's writable overlay layer on the engine's disk: the overlay2 driver on ext4 (as here) cannot limit
  its size (``--storage-opt size`` needs xfs with project quotas), so writes outside the tmpfs are bounded only
  by the command timeouts, and removed with the container;
- PID 1 is a loop of a statically linked bash (Debian's ``bash-static``) bind-mounted read-only from the host
  with a static busybox (``busybox-static``), so nothing the agent changes or kills inside (``pkill sleep``,
  ``kill -9 -1``) ends the container. Each command is an ``exec`` of that trusted bash, which runs the script
  with the image's ``/bin/bash`` (as LLB does) in its own process group, output to a file on a private tmpfs
  (a background job holding stdout open cannot hang the call), and SIGKILLs the group at the timeout;
- :meth:`DockerSandbox.check` (a task's evaluation) runs its script with the trusted static bash itself, so an
  agent that replaced ``/bin/bash`` (say with ``exit 0``) does not make its evaluation pass; the tools that
  script calls (``grep``, ``ls``, ...) are still the container's, as in LLB, where the checker runs in the
  agent's container too;
- what the agent can learn of the host: its kernel (``uname``), the mount sources in ``/proc/self/mountinfo``
  (the engine's overlay folders, the two tool paths), nothing it can act on with a read-only ``/proc/sys``
  (the ``core_pattern`` escape needs a writable one).

:class:`MariaDBContainer` (the :class:`~memrl_harness.backends.sql.SQLServer` protocol): Debian's MariaDB in a
container with no network, a read-only root, its data on a tmpfs, no capabilities, run as the image's
unprivileged ``mysql`` user with ``secure_file_priv`` on an empty read-only folder and ``local_infile`` off.
Its unix socket folder is bind-mounted from a private host folder (mode 0700); the episodes (a database and an
unprivileged user each, SQL through PyMySQL) are :mod:`memrl_harness.backends.mariadb`'s, over that socket.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from typing import Any, Self

from memrl_harness.backends.mariadb import HARDENING, MariaDBAdmin, MariaDBEpisode
from memrl_harness.backends.sandbox import CommandResult, SandboxError
from memrl_harness.backends.sql import SQLServerError

OS_IMAGE = "memrl/llb-os:bookworm"
DB_IMAGE = "memrl/mariadb:bookworm"
LABEL = "memrl.backend"
CLIENT_TIMEOUT = 900  # seconds without an answer from the engine: above any command's own timeout
OUTPUT_LIMIT = 65536  # bytes of a command's output kept, as the bubblewrap sandbox keeps
# Statically linked tools from the host (Debian's bash-static, busybox-static), mounted read-only.
TOOLS = {"/bin/bash-static": "/run/llb/bash", "/bin/busybox": "/run/llb/busybox"}
BASH, BUSYBOX = TOOLS["/bin/bash-static"], TOOLS["/bin/busybox"]
OUTPUT_DIR = "/run/llb-out"
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "AUDIT_WRITE"]
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LOGNAME": "root",
    "SHELL": "/bin/bash",
    "LANG": "C.UTF-8",
    "TERM": "xterm",
}

# PID 1: the kernel delivers no signal from inside the container to it; it reaps orphaned background jobs.
HOLDER = f"trap '' TERM INT HUP QUIT; while :; do {BUSYBOX} sleep 86400 & wait $!; done"

# One command, run by the trusted bash: ``$1 -c $4`` in a process group of its own (set -m: bash makes the group in
# parent and child, so it exists once ``&`` returns), which a watchdog kills after ``$2`` seconds (saying so on
# stderr); the first ``$3`` bytes of its output are printed.
TIMED_OUT = "llb-timed-out"
EXEC = f"""
shell=$1 limit=$2 keep=$3 script=$4 out={OUTPUT_DIR}/$$
set -m
"$shell" -c "$script" </dev/null >"$out" 2>&1 &
job=$!
alarm='{BUSYBOX} sleep "$1" && echo {TIMED_OUT} >&2 && kill -KILL -- -"$2"'
{BASH} -c "$alarm" watchdog "$limit" "$job" &
watchdog=$!
set +m
wait "$job"
code=$?
{{ kill -KILL -- -"$watchdog"; wait "$watchdog"; }} 2>/dev/null
{BUSYBOX} head -c "$keep" "$out"
{BUSYBOX} rm -f "$out"
exit "$code"
"""


class DockerBackendError(SandboxError, SQLServerError):
    """``backend=docker`` without the Docker SDK, without a reachable engine, or without the images."""


def docker_client() -> Any:
    """The engine of ``$DOCKER_HOST`` (default: the local socket), checked with a ping; a clear error otherwise."""
    try:
        import docker
    except ImportError as exc:
        raise DockerBackendError(
            "backend=docker needs the Docker SDK for Python: pip install 'memrl-mcp[docker]'"
        ) from exc
    try:
        client = docker.from_env(timeout=CLIENT_TIMEOUT)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerBackendError(
            "backend=docker needs a running Docker engine (as root: dockerd --iptables=false --ip6tables=false "
            f"--bridge=none &, or set DOCKER_HOST): {exc}"
        ) from exc
    return client


def require_image(client: Any, image: str) -> None:
    """Fail, saying how to build it, when ``image`` is not on the engine (nothing is ever pulled)."""
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as exc:
        raise DockerBackendError(f"backend=docker: no image {image} on the engine (build it: `make docker`)") from exc


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)


class DockerSandbox:
    """One episode's container of ``image`` (see the module doc). Use as a context manager."""

    def __init__(
        self,
        image: str = OS_IMAGE,
        command_timeout: float = 20.0,
        memory: str = "1g",
        pids: int = 256,
        tmp_size: str = "256m",
    ) -> None:
        missing = [host for host in TOOLS if not os.access(host, os.X_OK)]
        if missing:
            raise DockerBackendError(
                f"backend=docker: {', '.join(missing)} not found: apt-get install bash-static busybox-static "
                "(`make docker`)"
            )
        self.command_timeout = float(command_timeout)
        self.client = docker_client()
        require_image(self.client, image)
        self._lock = threading.Lock()
        self._closed = False
        self.name = f"llb-os-{uuid.uuid4().hex[:12]}"
        tmpfs = f"rw,exec,nosuid,nodev,size={tmp_size},mode=1777"
        try:
            self.container = self.client.containers.run(
                image,
                command=[BASH, "-c", HOLDER],
                entrypoint=[],
                name=self.name,
                hostname="llb-os",
                detach=True,
                network_mode="none",
                cap_drop=["ALL"],
                cap_add=CAPABILITIES,
                security_opt=["no-new-privileges"],
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=pids,
                ulimits=[{"Name": "rtprio", "Soft": 0, "Hard": 0}],
                tmpfs={"/tmp": tmpfs, "/var/tmp": tmpfs, OUTPUT_DIR: "rw,noexec,nosuid,nodev,size=64m,mode=0700"},
                volumes={host: {"bind": inside, "mode": "ro"} for host, inside in TOOLS.items()},
                environment=ENV,
                working_dir="/",
                labels={LABEL: "llb-os"},
            )
        except Exception as exc:
            raise SandboxError(f"backend=docker: cannot start a container of {image}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _remove, self.container)
        try:
            probe = self.run("echo ready", timeout=60)
        except BaseException:
            self.close()
            raise
        if probe.output.strip() != "ready":
            self.close()
            raise SandboxError(f"backend=docker: the container of {image} did not answer: {probe}")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run ``script`` with the container's ``/bin/bash -c``; its process group dies at the timeout."""
        return self._exec("/bin/bash", script, timeout)

    def check(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run ``script`` with the read-only static bash, whatever the agent made of ``/bin/bash``."""
        return self._exec(BASH, script, timeout)

    def _exec(self, shell: str, script: str, timeout: float | None) -> CommandResult:
        limit = self.command_timeout if timeout is None else float(timeout)
        started = time.monotonic()
        with self._lock:
            if self._closed:
                raise SandboxError("the container is removed")
            argv = [BASH, "-c", EXEC, "llb", shell, f"{limit:g}", str(OUTPUT_LIMIT), script]
            try:
                result = self.container.exec_run(argv, demux=True, user="root", workdir="/")
            except Exception as exc:
                raise SandboxError(f"backend=docker: exec in {self.name} failed: {exc}") from exc
        out, err = result.output if isinstance(result.output, tuple) else (result.output, b"")
        code = result.exit_code if result.exit_code is not None else -1
        timed_out = TIMED_OUT.encode() in (err or b"").splitlines()
        if timed_out:  # SIGKILLed by the wrapper; bash reports a signal as 128 + its number, the protocol negative
            code = -9
        return CommandResult(code, (out or b"").decode("utf-8", "replace"), timed_out, time.monotonic() - started)

    def close(self) -> None:
        """Remove the container and everything in it (idempotent)."""
        if not self._closed:
            self._closed = True
            self._finalizer()


MYSQL_UID = 999  # the image's `mysql` user (docker/mariadb/Dockerfile): owns the socket folder and the data tmpfs
SOCKET = "mysqld.sock"


def _stop_container(container: Any, folder: str) -> None:
    _remove(container)
    shutil.rmtree(folder, ignore_errors=True)


class MariaDBContainer:
    """MariaDB in a container of ``image`` (see the module doc), started on the first episode and stopped by
    :meth:`stop`, when collected, or at interpreter exit. Its administrator is ``root@localhost`` through the
    ``unix_socket`` plugin: a client running as root on the host, and nobody else (the container runs no root
    process; no password exists)."""

    engine = "MariaDB"

    def __init__(
        self, image: str = DB_IMAGE, memory: str = "2g", data_size: str = "1g", ready_timeout: float = 60.0
    ) -> None:
        self.image = image
        self.memory = memory
        self.data_size = data_size
        self.ready_timeout = ready_timeout
        self._lock = threading.RLock()
        self._container: Any = None
        self._admin: MariaDBAdmin | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def admin(self) -> MariaDBAdmin:
        """The server's administrator (for the harness and its tests; never given to an episode)."""
        if self._admin is None:
            raise SQLServerError("the MariaDB container is not started")
        return self._admin

    @property
    def running(self) -> bool:
        if self._container is None:
            return False
        with contextlib.suppress(Exception):
            self._container.reload()
            return self._container.status == "running"
        return False

    def episode(self, setup_sql: str, statement_timeout: float) -> contextlib.AbstractContextManager[MariaDBEpisode]:
        return self.start().admin.episode(setup_sql, statement_timeout)

    def start(self) -> Self:
        """Start the container (once; thread-safe) and wait until its server answers, at most ``ready_timeout``."""
        with self._lock:
            if self.running:
                return self
            if self._container is not None:
                self.stop()
                raise SQLServerError("the MariaDB container exited; it is restarted on the next call")
            client = docker_client()
            require_image(client, self.image)
            folder = tempfile.mkdtemp(prefix="llb-db-")  # 0700: host root and the container's mysql user only
            os.chown(folder, MYSQL_UID, MYSQL_UID)
            try:
                self._container = client.containers.run(
                    self.image,
                    command=list(HARDENING),  # the local server's options too (the entrypoint appends them)
                    name=f"llb-db-{uuid.uuid4().hex[:12]}",
                    detach=True,
                    network_mode="none",
                    read_only=True,
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    mem_limit=self.memory,
                    memswap_limit=self.memory,
                    pids_limit=512,
                    tmpfs={
                        "/var/lib/mysql": f"rw,nosuid,nodev,noexec,size={self.data_size},uid={MYSQL_UID},"
                        f"gid={MYSQL_UID},mode=0700",
                        "/tmp": "rw,nosuid,nodev,noexec,size=256m,mode=1777",
                    },
                    volumes={folder: {"bind": "/run/mysqld", "mode": "rw"}},
                    labels={LABEL: "llb-db"},
                )
            except Exception as exc:
                shutil.rmtree(folder, ignore_errors=True)
                raise SQLServerError(f"backend=docker: cannot start a container of {self.image}: {exc}") from exc
            self._finalizer = weakref.finalize(self, _stop_container, self._container, folder)
            admin = MariaDBAdmin(os.path.join(folder, SOCKET))
            deadline = time.monotonic() + self.ready_timeout
            while not (os.path.exists(admin.socket) and admin.admin("SELECT 1").error is None):
                if not self.running or time.monotonic() > deadline:
                    logs = ""
                    with contextlib.suppress(Exception):
                        logs = self._container.logs(tail=20).decode(errors="replace")
                    self.stop()
                    raise SQLServerError(f"MariaDB's container did not answer within {self.ready_timeout:g} s: {logs}")
                time.sleep(0.1)
            self._admin = admin
            return self

    def stop(self) -> None:
        """Remove the container and its socket folder (idempotent; a later episode starts a new one)."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
            self._finalizer = self._container = self._admin = None
