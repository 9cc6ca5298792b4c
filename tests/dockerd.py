"""The tests' Docker engine: the one already answering, else a dockerd started for the session and stopped at its
end. Only an engine this helper started is stopped, but it is stopped even if a later session still uses it: run
test sessions that need Docker one at a time, or keep an engine running. Import the fixture into a test module:
``from tests.dockerd import docker_engine  # noqa: F401`` and request ``docker_engine``.

The engine runs as these machines allow (ENVIRONMENT.md): root, no iptables, no default bridge, so containers get
``--network none`` or ``--network host`` only. Its images come from ``make docker``; nothing is pulled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import docker
import pytest

START_TIMEOUT = 60.0  # seconds for a fresh dockerd to answer (measured: 2-4 s on an idle machine)


def answering() -> Any | None:
    """A client of the engine at ``$DOCKER_HOST`` / the default socket if it answers a ping, else None."""
    try:
        client = docker.from_env(timeout=900)
        client.ping()
    except docker.errors.DockerException:
        return None
    return client


def start_dockerd() -> subprocess.Popen[bytes] | None:
    """Start dockerd (root needed) and wait until an engine answers; fail the session with what to do otherwise.
    None: the one started gave way to an engine another process started meanwhile, which is used instead."""
    binary = shutil.which("dockerd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if binary is None:
        pytest.fail("dockerd not found: install the Docker engine with `make docker` (apt-get install docker.io)")
    if os.geteuid() != 0:
        pytest.fail("no Docker engine answers and starting dockerd needs root")
    log = tempfile.NamedTemporaryFile(prefix="memrl-dockerd-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [binary, "--iptables=false", "--ip6tables=false", "--bridge=none"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + START_TIMEOUT
    while answering() is None:
        if process.poll() is not None:  # another engine (on the same files) may be starting: wait a little for it
            deadline = min(deadline, time.monotonic() + 10)
        if time.monotonic() > deadline:
            stop_dockerd(process)
            with open(log.name, errors="replace") as text:
                pytest.fail(f"dockerd did not start (log {log.name}): {text.read()[-2000:]}")
        time.sleep(0.25)
    return process if process.poll() is None else None


def stop_dockerd(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (dockerd stops its containers first), SIGKILL after a minute."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Any]:
    """A Docker SDK client of a running engine for the whole session."""
    client = answering()
    started = None
    if client is None:
        started = start_dockerd()
        client = answering()
        assert client is not None, "dockerd answered, then no longer"
    try:
        yield client
    finally:
        client.close()
        if started is not None:
            stop_dockerd(started)
