"""The Docker backends of llb-os / llb-db, tested without a Docker engine (none runs on these machines).

A hand-written fake client records ``containers.run`` / ``exec_run`` / ``remove`` calls. For the OS
sandbox it runs the exec argv on the host with ``subprocess`` (harmless scripts only), so the real
command construction (timeout, output capture, background jobs) is exercised; for MySQL it answers
with canned client output. What these tests cannot show: that real containers of ``ubuntu:22.04`` /
``mysql:8`` behave the same (never run here).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections import namedtuple
from collections.abc import Callable
from typing import Any

import pytest

from harness.benchmarks.llb_db import LLBDBBenchmark
from harness.benchmarks.llb_docker import (
    ARG_LIMIT,
    DockerBackendError,
    DockerSandbox,
    MySQLDocker,
    docker_client,
    mysql_command,
    os_command,
)
from harness.benchmarks.llb_os import LLBOSBenchmark, SandboxError

ExecResult = namedtuple("ExecResult", "exit_code output")  # as docker.models.containers.ExecResult


class FakeContainer:
    def __init__(self, client: FakeClient, image: str, kwargs: dict[str, Any]) -> None:
        self.client, self.image, self.kwargs = client, image, kwargs
        self.status = "running"
        self.execs: list[tuple[list[str], dict[str, Any]]] = []
        self.removed: list[dict[str, Any]] = []
        self.archives: list[tuple[str, bytes]] = []

    def exec_run(self, cmd: list[str], **kwargs: Any) -> ExecResult:
        assert self.status == "running" and not self.removed
        self.execs.append((cmd, kwargs))
        return self.client.answer(cmd, kwargs)

    def reload(self) -> None:
        pass

    def logs(self, tail: int = 30) -> bytes:
        return b"log tail"

    def put_archive(self, path: str, data: bytes) -> bool:
        self.archives.append((path, data))
        return True

    def remove(self, **kwargs: Any) -> None:
        self.removed.append(kwargs)
        self.status = "removed"


class FakeContainers:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.started: list[FakeContainer] = []

    def run(self, image: str, **kwargs: Any) -> FakeContainer:
        container = FakeContainer(self.client, image, kwargs)
        self.started.append(container)
        return container


class FakeClient:
    """Records calls; ``answer(cmd, kwargs)`` gives each exec's result."""

    def __init__(self, answer: Callable[[list[str], dict[str, Any]], ExecResult]) -> None:
        self.answer = answer
        self.containers = FakeContainers(self)


def run_on_host(cmd: list[str], kwargs: dict[str, Any]) -> ExecResult:
    """What the container would do with the exec, done on this machine (demux: stdout, stderr)."""
    assert kwargs.get("demux") is True
    done = subprocess.run(cmd, capture_output=True, timeout=60, env=kwargs.get("environment"))
    return ExecResult(done.returncode, (done.stdout or None, done.stderr or None))


# --- OS --------------------------------------------------------------------------------------


def test_os_container_arguments_commands_and_teardown() -> None:
    client = FakeClient(run_on_host)
    with DockerSandbox("ubuntu:22.04", command_timeout=5, client=client) as box:
        (container,) = client.containers.started
        assert container.image == "ubuntu:22.04"
        kw = container.kwargs
        assert kw["network_mode"] == "none" and kw["detach"] is True and kw["init"] is True
        assert kw["command"] == ["sleep", "infinity"] and kw["labels"] == {"memrl.llb": "os"}
        probe_cmd, probe_kwargs = container.execs[0]  # the readiness probe
        assert probe_cmd[:2] == ["bash", "-c"] and "timeout -k 5 60 bash -c" in probe_cmd[2]
        assert probe_kwargs["demux"] is True and probe_kwargs["user"] == "root"

        result = box.run("echo out; echo err >&2; exit 3")
        assert result.exit_code == 3 and not result.timed_out
        assert result.output.split() == ["out", "err"]  # stderr interleaved, as the bwrap holder gives it
        assert "timeout -k 5 5 bash -c" in container.execs[-1][0][2]

        started = time.monotonic()
        slow = box.run("echo before; sleep 30; echo after", timeout=1)
        assert slow.timed_out and slow.exit_code == 124 and slow.output.strip() == "before"
        assert time.monotonic() - started < 10

        started = time.monotonic()  # a background job keeping stdout open does not hang the exec
        job = box.run("sleep 3 & echo started")
        assert job.exit_code == 0 and job.output.strip() == "started" and time.monotonic() - started < 2

        big = box.run("head -c 200000 /dev/zero | tr '\\0' x")
        assert len(big.output) == 65536
        assert not container.removed
    assert container.removed == [{"force": True}]
    box.close()  # idempotent
    assert container.removed == [{"force": True}]
    with pytest.raises(SandboxError, match="removed"):
        box.run("true")


def test_os_command_quotes_the_script() -> None:
    script = "echo \"it's\" $HOME; printf '%s\\n' a\\ b"
    argv = os_command(script, 7.5, limit=100)
    assert argv[:2] == ["bash", "-c"] and "timeout -k 5 7.5 bash -c" in argv[2] and "head -c 100" in argv[2]
    done = subprocess.run(argv, capture_output=True, text=True, env={"HOME": "/root", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout == "it's /root\na b\n"


def test_os_benchmark_uses_the_container(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def answer(cmd: list[str], kwargs: dict[str, Any]) -> ExecResult:
        calls.append(cmd[2])
        return ExecResult(0, (b"ready\n", None))

    client = FakeClient(answer)
    monkeypatch.setenv("MEMRL_LLB_ROOTFS", "/nonexistent")  # the bwrap prerequisites are not checked
    bench = LLBOSBenchmark(ids="1", backend="docker", docker_client=client)
    assert bench.image == "ubuntu:22.04" and "Linux (Ubuntu)" in bench.system_prompt
    task = bench.tasks()[0]
    with bench.sandbox() as box:
        assert isinstance(box, DockerSandbox)
        bench.initialize(box, task)
        assert bench.evaluate(box, task).exit_code == 0
    container = client.containers.started[0]
    assert container.kwargs["network_mode"] == "none" and container.removed == [{"force": True}]
    init, evaluation = bench.script(task, "init"), bench.script(task, "evaluation")
    for script in (init, evaluation):  # each task script, quoted whole, as bash -c's argument
        assert sum(shlex.quote("exec 2>&1\n" + script) in c for c in calls) == 1
    with pytest.raises(ValueError, match="backend"):
        LLBOSBenchmark(ids="1", backend="podman")


# --- the errors without Docker ----------------------------------------------------------------


def test_no_engine_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    for make in (
        lambda: LLBOSBenchmark(ids="1", backend="docker"),
        lambda: LLBDBBenchmark(ids="351", backend="docker"),
        lambda: docker_client(),
    ):
        with pytest.raises(DockerBackendError, match=r"backend=docker needs a reachable Docker engine"):
            make()


def test_no_sdk_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` raises ImportError
    with pytest.raises(DockerBackendError, match=r"backend=docker needs the Docker SDK.*memrl-mcp\[docker\]"):
        LLBOSBenchmark(ids="1", backend="docker")
    with pytest.raises(DockerBackendError, match=r"backend=docker needs the Docker SDK"):
        LLBDBBenchmark(ids="351", backend="docker")


# --- DB --------------------------------------------------------------------------------------


def xml(rows: list[list[tuple[str, str | None]]]) -> bytes:
    body = "".join(
        "<row>"
        + "".join(
            f'<field name="{n}" xsi:nil="true" />' if v is None else f'<field name="{n}">{v}</field>' for n, v in row
        )
        + "</row>"
        for row in rows
    )
    return (
        '<?xml version="1.0"?>\n<resultset statement="q" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
        + body
        + "</resultset>\n"
    ).encode()


class FakeMySQL:
    """Canned ``mysql`` client answers: the temporary server first, then the real one."""

    def __init__(self) -> None:
        self.pings = 0
        self.sql: list[str] = []

    def __call__(self, cmd: list[str], kwargs: dict[str, Any]) -> ExecResult:
        assert kwargs["demux"] is True and kwargs["environment"]["MYSQL_PWD"]
        sql = cmd[-1] if cmd[-2] == "-e" else "<file>"
        self.sql.append(sql)
        if "@@skip_networking" in sql:
            self.pings += 1
            if self.pings == 1:
                return ExecResult(1, (None, b"ERROR 2002 (HY000): Can't connect"))
            return ExecResult(0, (xml([[("s", "1" if self.pings == 2 else "0")]]), None))
        if "SELEC " in sql:
            return ExecResult(1, (None, b"ERROR 1064 (42000) at line 1: You have an error in your SQL syntax"))
        if "SLEEP" in sql:
            return ExecResult(124, (None, None))
        if "MD5(GROUP_CONCAT" in sql:
            return ExecResult(0, (xml([[("hash", "abc123")]]), None))
        return ExecResult(0, (xml([[("a", "1"), ("b", None)], [("a", "2.5"), ("b", "x")]]), None))


def test_mysql_container_arguments_queries_and_teardown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.benchmarks.llb_docker.time.sleep", lambda s: None)
    fake = FakeMySQL()
    client = FakeClient(fake)
    server = MySQLDocker(client=client).start()
    (container,) = client.containers.started
    kw = container.kwargs
    assert container.image == "mysql:8" and kw["network_mode"] == "none" and kw["detach"] is True
    password = kw["environment"]["MYSQL_ROOT_PASSWORD"]
    assert len(password) == 32 and fake.pings == 3  # down, temporary server, real server
    assert all(k["environment"] == {"MYSQL_PWD": password} for _, k in container.execs)
    assert server.start() is server and len(client.containers.started) == 1

    result = server.execute("SELECT a, b FROM t;", "llb_x", timeout=4)
    argv = container.execs[-1][0]
    assert argv[:4] == ["timeout", "-k", "5", "24"] and argv[4] == "mysql" and "--xml" in argv
    assert "--database=llb_x" in argv and "--init-command=SET SESSION max_execution_time=4000" in argv
    assert argv[-2:] == ["-e", "SELECT a, b FROM t;"] and password not in " ".join(argv)
    assert result.error is None and result.last == (["a", "b"], [(1, None), (2.5, "x")])

    error = server.execute("SELEC 1;")
    assert error.error and "syntax" in error.error
    assert "did not finish" in (server.execute("SELECT SLEEP(100);").error or "")

    big = "INSERT INTO t VALUES " + ",".join(["('x')"] * (ARG_LIMIT // 5)) + ";"
    assert server.execute(big, "llb_x").error is None
    folder, tar = container.archives[-1]
    assert folder == "/tmp" and big.encode() in tar
    assert container.execs[-1][0][:2] == ["bash", "-c"] and "< /tmp/llb-sql-" in container.execs[-1][0][2]

    server.stop()
    assert container.removed == [{"force": True}] and server.container is None
    server.stop()
    assert container.removed == [{"force": True}]


def test_mysql_command_without_database() -> None:
    argv = mysql_command("SELECT 1;", None, 10)
    assert not any(a.startswith("--database") for a in argv) and argv[-1] == "SELECT 1;"


def test_db_benchmark_on_the_docker_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.benchmarks.llb_docker.time.sleep", lambda s: None)
    fake = FakeMySQL()
    client = FakeClient(fake)
    bench = LLBDBBenchmark(ids="351,254", backend="docker", docker_client=client)
    assert isinstance(bench.server, MySQLDocker) and bench.engine == "MySQL"
    insert = bench.tasks()[0]
    assert "The MySQL table" in bench.prompt(insert, [])
    with bench:
        with bench.database(insert) as name:
            assert name.startswith("llb_")
            assert bench.table_md5(insert, name) == "abc123"
        assert any(s.startswith(f"CREATE DATABASE `{name}`") for s in fake.sql)
        assert any(s.startswith("CREATE TABLE") for s in fake.sql)
        assert fake.sql[-1] == f"DROP DATABASE IF EXISTS `{name}`;"
    assert client.containers.started[0].removed == [{"force": True}]
    with pytest.raises(ValueError, match="backend"):
        LLBDBBenchmark(ids="351", backend="sqlite")
