"""Docker backends of the LifelongAgentBench benchmarks (``--option backend=docker``).

LifelongAgentBench itself runs each OS task in a fresh container of an image it builds from an
Ubuntu base (``docker build -f scripts/dockerfile/os_interaction/default ... --tag local-os/default``)
and the DB tasks in a ``mysql`` container. These classes do the same through the Docker SDK for
Python (``pip install 'memrl-mcp[docker]'``: ``docker>=7``) and a reachable Docker engine, behind the
interfaces of the local backends:

- :class:`DockerSandbox` is the ``llb-os`` :class:`~harness.benchmarks.llb_os.Sandbox`: one container
  per task (``image`` option, default ``ubuntu:22.04``; ``image=local-os/default`` for LLB's own),
  started with ``network_mode="none"``, ``init=True`` and ``sleep infinity`` so that files, users and
  background jobs persist between the task's commands. Each command runs as
  ``timeout -k 5 N bash -c 'exec 2>&1; SCRIPT'`` through ``exec_run`` (the Docker API has no exec
  timeout); its output goes to a file that is read back and deleted afterwards, so a background job
  keeping its stdout open cannot hang the exec. ``timeout`` kills the command's whole process group,
  as the bubblewrap holder does. Teardown: ``container.remove(force=True)``.
- :class:`MySQLDocker` is the ``llb-db`` :class:`~harness.benchmarks.llb_db.MariaDB`: one ``mysql``
  container (``image`` option, default ``mysql:8``) per benchmark object, a random root password in
  its environment, ``network_mode="none"``; SQL goes through the ``mysql`` client *inside* the
  container (``exec_run``, ``--xml``, the password in ``MYSQL_PWD``), parsed by the same code as the
  MariaDB client's output; ready when the final server (``@@skip_networking = 0``, not the
  entrypoint's temporary one) answers, within ``ready_timeout``.

Differences from the local backends: a command killed by a signal reports ``128 + signal`` (not a
negative status); ``timed_out`` is a 124/137 status after at least the timeout; MySQL's statement
limit (``max_execution_time``) applies to SELECT only.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import shlex
import tarfile
import threading
import time
import uuid
import weakref
from typing import Any

from harness.benchmarks.llb_db import MariaDBError, SQLResult, _parse_xml
from harness.benchmarks.llb_os import OUTPUT_LIMIT, PATH, CommandResult, SandboxError

DEFAULT_OS_IMAGE = "ubuntu:22.04"
DEFAULT_DB_IMAGE = "mysql:8"
LABEL = "memrl.llb"
CLIENT_TIMEOUT = 600  # seconds: the SDK's HTTP read timeout, above any command's own timeout
ENV = {"PATH": PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "LANG": "C.UTF-8"}
ENV["TERM"] = "xterm"
KILL_GRACE = 5  # seconds between timeout's TERM and KILL
ARG_LIMIT = 100_000  # bytes of SQL passed as an argument; longer scripts are copied in as a file


class DockerBackendError(RuntimeError):
    """``backend=docker`` chosen without the Docker SDK or without a reachable engine."""


def docker_client(client: Any = None) -> Any:
    """``client`` as given (tests inject a fake), else ``docker.from_env()`` checked with a ping."""
    if client is not None:
        return client
    try:
        import docker
    except ImportError as exc:
        raise DockerBackendError(
            "backend=docker needs the Docker SDK for Python, which is not installed: "
            "pip install 'memrl-mcp[docker]' (or pip install 'docker>=7')"
        ) from exc
    try:
        found = docker.from_env(timeout=CLIENT_TIMEOUT)
        found.ping()
    except Exception as exc:  # docker.errors.DockerException, requests' connection errors, ...
        raise DockerBackendError(
            "backend=docker needs a reachable Docker engine (start dockerd, or set DOCKER_HOST); "
            f"the Docker SDK could not reach one: {exc}"
        ) from exc
    return found


def _output(result: Any) -> tuple[int, bytes]:
    """``exec_run(..., demux=True)``'s (exit code, stdout + stderr)."""
    code, streams = result.exit_code, result.output
    data = b"".join(part or b"" for part in streams) if isinstance(streams, tuple) else streams or b""
    return (code if code is not None else -1), data


def os_command(script: str, timeout: float, limit: int = OUTPUT_LIMIT) -> list[str]:
    """The argv that runs ``script`` in the container: bash, its process group killed at ``timeout``.

    Output (stdout and stderr interleaved) goes to a file outside ``/tmp``; its first ``limit`` bytes
    are printed once the command ended, and the file is removed; the exit status is the command's.
    """
    inner = shlex.join(["timeout", "-k", str(KILL_GRACE), f"{timeout:g}", "bash", "-c", "exec 2>&1\n" + script])
    outer = (
        "out=$(mktemp /run/llb-exec.XXXXXXXX 2>/dev/null || mktemp /var/tmp/llb-exec.XXXXXXXX) || exit 125\n"
        f'(cd / && exec {inner}) </dev/null >"$out" 2>&1\n'
        "code=$?\n"
        f'head -c {int(limit)} "$out"\n'
        'rm -f "$out"\n'
        'exit "$code"'
    )
    return ["bash", "-c", outer]


class DockerSandbox:
    """One task's container (see the module doc); the interface of ``llb_os.Sandbox``."""

    def __init__(
        self,
        image: str = DEFAULT_OS_IMAGE,
        command_timeout: float = 20.0,
        client: Any = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.image = image
        self.command_timeout = float(command_timeout)
        self.client = docker_client(client)
        self._lock = threading.Lock()
        self._closed = False
        self.name = f"llb-os-{uuid.uuid4().hex[:12]}"
        try:
            self.container = self.client.containers.run(
                image,
                command=["sleep", "infinity"],
                name=self.name,
                hostname="llb-os",
                detach=True,
                init=True,  # docker-init as PID 1 reaps the background jobs' zombies
                network_mode="none",
                environment=dict(ENV),
                working_dir="/",
                labels={LABEL: "os"},
            )
        except Exception as exc:
            raise SandboxError(f"backend=docker: cannot start a container of {image}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _remove, self.container)
        try:
            probe = self.run("echo ready", timeout=ready_timeout)
        except BaseException:
            self.close()
            raise
        if probe.output.strip() != "ready":
            self.close()
            raise SandboxError(f"backend=docker: the container of {image} did not answer: {probe}")

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run ``script`` with ``bash -c`` in the container; its process group dies at the timeout."""
        limit = self.command_timeout if timeout is None else float(timeout)
        started = time.monotonic()
        with self._lock:
            if self._closed:
                raise SandboxError("the container is removed")
            try:
                result = self.container.exec_run(
                    os_command(script, limit), demux=True, environment=dict(ENV), workdir="/", user="root"
                )
            except Exception as exc:
                raise SandboxError(f"backend=docker: exec in {self.name} failed: {exc}") from exc
        code, data = _output(result)
        seconds = time.monotonic() - started
        timed_out = code in (124, 137) and seconds >= limit - 0.05
        return CommandResult(code, data.decode("utf-8", "replace"), timed_out, seconds)

    def close(self) -> None:
        """Remove the container and everything in it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)


def mysql_command(sql: str | None, database: str | None, timeout: float, file: str | None = None) -> list[str]:
    """The ``mysql`` client argv run in the container (``--xml``; SQL in ``-e`` or read from ``file``)."""
    client = ["mysql", "--no-defaults", "--user=root", "--xml", "--default-character-set=utf8mb4"]
    client.append(f"--init-command=SET SESSION max_execution_time={int(timeout * 1000)}")
    if database:
        client.append(f"--database={database}")
    wrapped = ["timeout", "-k", str(KILL_GRACE), f"{timeout + 20:g}", *client]
    if file is None:
        return [*wrapped, "-e", sql or ""]
    script = f"{shlex.join(wrapped)} < {shlex.quote(file)}; code=$?; rm -f {shlex.quote(file)}; exit $code"
    return ["bash", "-c", script]


class MySQLDocker:
    """A MySQL server in a container; the interface of ``llb_db.MariaDB``."""

    engine = "MySQL"

    def __init__(self, image: str = DEFAULT_DB_IMAGE, ready_timeout: float = 180.0, client: Any = None) -> None:
        self.image = image
        self.ready_timeout = ready_timeout
        self._client_given = client
        self._lock = threading.RLock()
        self.container: Any = None
        self._password = ""
        self._finalizer: weakref.finalize | None = None

    @property
    def running(self) -> bool:
        if self.container is None:
            return False
        with contextlib.suppress(Exception):
            self.container.reload()
            return self.container.status == "running"
        return False

    def start(self) -> MySQLDocker:
        """Start the container (once; thread-safe) and wait until the server answers."""
        with self._lock:
            if self.container is not None:
                if self.running:
                    return self
                self.stop()
                raise MariaDBError("the MySQL container exited; it is restarted on the next call")
            client = docker_client(self._client_given)
            self._password = secrets.token_hex(16)
            try:
                self.container = client.containers.run(
                    self.image,
                    command=["--character-set-server=utf8mb4", "--max-connections=500", "--skip-log-bin"],
                    name=f"llb-db-{uuid.uuid4().hex[:12]}",
                    detach=True,
                    network_mode="none",
                    environment={"MYSQL_ROOT_PASSWORD": self._password},
                    labels={LABEL: "db"},
                )
            except Exception as exc:
                raise MariaDBError(f"backend=docker: cannot start a container of {self.image}: {exc}") from exc
            self._finalizer = weakref.finalize(self, _remove, self.container)
            deadline = time.monotonic() + self.ready_timeout
            while True:
                if not self.running:
                    tail = ""
                    with contextlib.suppress(Exception):
                        tail = self.container.logs(tail=30).decode(errors="replace")
                    self.stop()
                    raise MariaDBError(f"the MySQL container exited: {tail}")
                # The entrypoint first runs a temporary server with networking off: wait for the real one.
                ping = self._client("SELECT @@skip_networking AS s;", None, 10.0)
                if ping.error is None and ping.last is not None and ping.last[1] == [(0,)]:
                    return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise MariaDBError(f"MySQL not ready after {self.ready_timeout:g} s")
                time.sleep(0.5)

    def stop(self) -> None:
        """Remove the container (idempotent; a later call starts a new one)."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
            self._finalizer = self.container = None

    def execute(self, sql: str, database: str | None = None, timeout: float = 10.0) -> SQLResult:
        """Run an SQL script (one or more statements); stops at the first error."""
        if not self.running:
            self.start()
        return self._client(sql, database, timeout)

    def _client(self, sql: str, database: str | None, timeout: float) -> SQLResult:
        if len(sql.encode()) <= ARG_LIMIT:
            argv = mysql_command(sql, database, timeout)
        else:
            path = f"/tmp/llb-sql-{uuid.uuid4().hex}.sql"
            self._put(path, sql.encode())
            argv = mysql_command(None, database, timeout, file=path)
        try:
            result = self.container.exec_run(argv, demux=True, environment={"MYSQL_PWD": self._password})
        except Exception as exc:
            return SQLResult(error=f"backend=docker: exec in the MySQL container failed: {exc}")
        code = result.exit_code if result.exit_code is not None else -1
        out, err = result.output if isinstance(result.output, tuple) else (result.output, b"")
        results = _parse_xml((out or b"").decode(errors="replace"))
        error = None
        if code in (124, 137):
            error = f"the SQL did not finish within {timeout + 20:g} s"
        elif code != 0:
            error = (err or b"").decode(errors="replace").strip() or f"mysql exited with status {code}"
        return SQLResult(results, error)

    def _put(self, path: str, data: bytes) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(path.rsplit("/", 1)[1])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        self.container.put_archive(path.rsplit("/", 1)[0], buffer.getvalue())
