"""The Docker backends (memrl_harness/backends/docker.py) on a real engine (tests/dockerd.py) and the images of
``make docker``: what a sandbox and the MariaDB container do, and LLB's oracles on them (a sample here; all 350 OS
and 361 DB tasks were run once, see /work/notes/readme-docker.md). The attacks are in test_attacks_docker.py.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from memrl_harness.backends.docker import OUTPUT_LIMIT, DockerBackendError, DockerSandbox, MariaDBContainer
from memrl_harness.backends.sandbox import SandboxError
from memrl_harness.benchmarks.llb_db import LLBDBBenchmark
from memrl_harness.benchmarks.llb_os import LLBOSBenchmark
from tests.dockerd import docker_engine  # noqa: F401 (the session's engine)

pytestmark = pytest.mark.slow  # needs a Docker engine: `make test` runs it, `make test-fast` does not

SAMPLE = 12  # tasks per oracle here
# Gold SQL MariaDB rejects (DELETE ... AS) or answers with other rows (LIMIT without ORDER BY, ties): the same 14
# on both backends.
SQL_DIALECT_MISSES = {"165", "334", "388", "213", "228", "273", "274", "295", "302", "400", "41", "6", "72", "96"}


@pytest.fixture
def box(docker_engine: Any) -> Iterator[DockerSandbox]:  # noqa: F811
    with DockerSandbox(command_timeout=5) as sandbox:
        yield sandbox


def test_commands_share_one_system(box: DockerSandbox) -> None:
    result = box.run("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.output, result.timed_out) == (3, "out\nerr\n", False)
    assert box.run("useradd -m alice && mkdir /srv/data && echo 42 > /srv/data/f && cd /srv").exit_code == 0
    assert box.run("cat /srv/data/f; id -un alice; pwd").output == "42\nalice\n/\n"  # each command starts in /
    assert box.run("sleep 60 & echo $! > /tmp/job").exit_code == 0  # a background job outlives its command
    assert box.run("kill -0 $(cat /tmp/job) && echo alive").output == "alive\n"
    assert len(box.run("head -c 200000 /dev/zero | tr '\\0' x").output) == OUTPUT_LIMIT


def test_a_timeout_kills_the_commands_process_group_and_the_sandbox_goes_on(box: DockerSandbox) -> None:
    started = time.monotonic()
    slow = box.run("sleep 50 & echo before; sleep 40; echo after", timeout=1)
    assert slow.timed_out and slow.exit_code == -9 and slow.output == "before\n"
    assert time.monotonic() - started < 10
    assert box.run("pgrep -x sleep || echo none").output == "none\n"
    assert box.run("echo next").output == "next\n"


def test_the_checker_runs_a_shell_the_agent_cannot_replace(box: DockerSandbox) -> None:
    replaced = box.run("rm /bin/bash && printf '#!/bin/sh\\nexit 0\\n' > /bin/bash && chmod +x /bin/bash")
    assert replaced.exit_code == 0
    assert box.run("false").exit_code == 0  # the agent's commands now run its fake bash
    assert box.check("false").exit_code == 1 and box.check("test -d /root").exit_code == 0
    assert box.check("echo $BASH_VERSION").output.startswith("5.")


def test_killing_everything_inside_does_not_end_the_sandbox(box: DockerSandbox) -> None:
    box.run("pkill -9 sleep; pkill -9 busybox; kill -9 -1")
    assert box.run("echo still here").output == "still here\n"


def test_close_removes_the_container(docker_engine: Any) -> None:  # noqa: F811
    sandbox = DockerSandbox()
    assert docker_engine.containers.get(sandbox.name).status == "running"
    sandbox.close()
    assert docker_engine.containers.list(all=True, filters={"name": sandbox.name}) == []
    sandbox.close()  # idempotent
    with pytest.raises(SandboxError, match="removed"):
        sandbox.run("true")


def test_a_missing_image_or_engine_is_a_clear_error(docker_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    with pytest.raises(DockerBackendError, match=r"no image memrl/no-such:image .*make docker"):
        DockerSandbox(image="memrl/no-such:image")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(DockerBackendError, match="needs a running Docker engine"):
        DockerSandbox()
    with pytest.raises(DockerBackendError, match="needs a running Docker engine"):
        MariaDBContainer().start()


def test_the_mariadb_container_serves_episodes_on_its_socket_only(docker_engine: Any) -> None:  # noqa: F811
    server = MariaDBContainer().start()
    try:
        settings = server.admin.admin("SELECT CURRENT_USER(), @@secure_file_priv, @@local_infile, @@skip_networking")
        assert settings.last is not None and settings.last.rows == [("root@localhost", "/var/empty-sql-files/", 0, 1)]
        # The local server's hardening applies here too: no events, no MEMORY tables, a memory cap per session.
        hardening = server.admin.admin("SELECT @@event_scheduler, @@enforce_storage_engine, @@max_session_mem_used")
        assert hardening.last is not None and hardening.last.rows == [("DISABLED", "InnoDB", 256 * 1024 * 1024)]
        (container,) = docker_engine.containers.list(filters={"label": "memrl.backend=llb-db"})
        host = container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
        assert container.exec_run(["id", "-un"]).output == b"mysql\n"  # the server's user: no root inside
        with server.episode("CREATE TABLE t (a INT); INSERT INTO t VALUES (1), (2);", 5) as episode:
            mine = episode.execute("SELECT SUM(a) FROM t; SELECT CURRENT_USER()")
            assert mine.error is None and [r.rows for r in mine.results] == [[(3,)], [(f"{episode.name}@localhost",)]]
            assert episode.inspect("SELECT COUNT(*) FROM t").rows == [(2,)]
        socket = server.admin.socket
    finally:
        server.stop()
    assert docker_engine.containers.list(all=True, filters={"id": container.id}) == []
    assert not os.path.exists(os.path.dirname(socket))


def test_llb_os_ground_truth_passes_and_doing_nothing_fails_on_docker(docker_engine: Any) -> None:  # noqa: F811
    every = LLBOSBenchmark(backend="docker").tasks()
    bench = LLBOSBenchmark(backend="docker", ids=[t.id for t in random.Random(12).sample(list(every), SAMPLE)])

    def verdict(task: Any, ground_truth: bool) -> bool:
        with bench.sandbox() as sandbox:
            bench.initialize(sandbox, task)
            if ground_truth:
                sandbox.run(bench.script(task, "ground_truth"), timeout=bench.options.eval_timeout)
            result = bench.evaluate(sandbox, task)
            return result.exit_code == 0 and not result.timed_out

    with ThreadPoolExecutor(4) as pool:
        solved = list(pool.map(lambda t: verdict(t, True), bench.tasks()))
        untouched = list(pool.map(lambda t: verdict(t, False), bench.tasks()))
    assert all(solved) and not any(untouched)


def test_llb_db_gold_sql_passes_and_doing_nothing_fails_on_docker(docker_engine: Any) -> None:  # noqa: F811
    every = LLBDBBenchmark().tasks()
    md5 = [t.id for t in every if t.data["answer_info"].get("md5") and t.id not in SQL_DIALECT_MISSES]
    select = [t.id for t in every if t.type == "select" and t.id not in SQL_DIALECT_MISSES]
    chosen = random.Random(12).sample(md5, SAMPLE // 2) + random.Random(12).sample(select, SAMPLE // 2)
    with LLBDBBenchmark(ids=chosen, backend="docker") as bench, ThreadPoolExecutor(4) as pool:
        assert isinstance(bench.server, MariaDBContainer)
        assert all(o.success for o in pool.map(bench.oracle, bench.tasks()))
        assert not any(o.success for o in pool.map(bench.nothing, [t for t in bench.tasks() if t.id in md5]))
