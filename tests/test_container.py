"""The memory server's container (docker/server/Dockerfile), built and run on a real engine.

The engine has no bridge network here (``--bridge=none``), so no port can be published: the container shares the
host's network (``--network host``) and its server listens on 127.0.0.1 on a free port (``MEMRL_HOST`` /
``MEMRL_PORT``); with a token all the same, as a published container would need. Memories live in a named volume.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.dockerd import docker_engine  # noqa: F401 (the session's engine)
from tests.support.mcp import call
from tests.support.servers import free_port

# needs a Docker engine and the image build: `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow

IMAGE = "memrl/memrl-mcp:local"
ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TOKEN = "container-token-0123456789"
TASK = "Rotate the logs of a web server every night"
APP_UID = 10001  # the image's `memrl` user


def readme_docker_lines() -> tuple[list[str], list[str]]:
    """The README's container commands: the build, and the run (its continuation lines joined)."""
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", README, re.S) if "docker/build.sh" in b]
    build, run = block.replace("\\\n", " ").strip().splitlines()
    return shlex.split(build.split("#")[0]), shlex.split(run.split("#")[0])


@pytest.fixture(scope="module")
def image(docker_engine: Any) -> Any:  # noqa: F811
    """The image as the README's build line builds it, with no registry (as ``make docker`` does): rebuilt here if
    its inputs changed since, else kept."""
    build, _ = readme_docker_lines()
    built = subprocess.run(
        build, cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=1800
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return docker_engine.images.get(IMAGE)


def test_the_image_runs_as_a_user_with_a_volume_and_a_health_check(image: Any) -> None:
    config = image.attrs["Config"]
    assert config["User"] == "memrl" and "/data" in config["Volumes"]
    assert "/health" in " ".join(config["Healthcheck"]["Test"])
    assert "MEMRL_DATA_DIR=/data" in config["Env"]
    server = json.loads((ROOT / "server.json").read_text())
    assert config["Labels"]["io.modelcontextprotocol.server.name"] == server["name"]  # the registry's proof


def test_the_readme_runs_this_image_on_an_engine_without_a_bridge() -> None:
    """The README's run line: this image, on the host's network (no port can be published without a bridge), its
    tokens from a mounted file; the test below runs it so, with a port of its own."""
    build, run = readme_docker_lines()
    assert build[:1] == ["docker/build.sh"] and set(build[1:]) == {"base", "server"}  # nothing pulled
    assert run[:3] == ["docker", "run", "-d"] and run[-1] == IMAGE
    assert run[run.index("--network") + 1] == "host" and "-p" not in run
    assert run[run.index("-e") + 1] == "MEMRL_TOKENS_FILE=/run/secrets/tokens"
    assert "$PWD/tokens.yaml:/run/secrets/tokens:ro" in run


def test_without_a_token_it_refuses_to_serve_on_every_interface(docker_engine: Any, image: Any) -> None:  # noqa: F811
    container = docker_engine.containers.run(IMAGE, detach=True, network_mode="none")
    try:
        assert container.wait(timeout=120)["StatusCode"] == 2
        assert "refusing to serve on 0.0.0.0 without a token" in container.logs().decode()
    finally:
        container.remove(force=True, v=True)  # with its anonymous /data volume


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    """The tokens file, readable by the container's user only, as a mounted secret would be."""
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [{"name": "ci", "token": TOKEN, "namespaces": ["*"]}]}))
    path.chmod(0o400)
    subprocess.run(["chown", str(APP_UID), str(path)], check=True)
    return path


@pytest.fixture
def volume(docker_engine: Any) -> Iterator[str]:  # noqa: F811
    created = docker_engine.volumes.create(f"memrl-test-{uuid.uuid4().hex[:12]}")
    yield created.name
    created.remove(force=True)


def wait_healthy(container: Any, timeout: float = 120.0) -> None:
    """Until the image's own health check (run every second here) says healthy."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        state = container.attrs["State"]
        if state.get("Health", {}).get("Status") == "healthy":
            return
        assert state["Status"] == "running", container.logs().decode()[-2000:]
        assert time.monotonic() < deadline, f"not healthy after {timeout:g} s: {container.logs().decode()[-2000:]}"
        time.sleep(0.5)


@asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Client]:
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
        yield await stack.enter_async_context(Client(streamable_http_client(url, http_client=http)))


@pytest.mark.anyio
async def test_recall_and_report_over_http_survive_a_restart(
    docker_engine: Any,  # noqa: F811
    image: Any,
    tokens: Path,
    volume: str,
) -> None:
    port = free_port()
    container = docker_engine.containers.run(
        IMAGE,
        detach=True,
        network_mode="host",
        environment={"MEMRL_HOST": "127.0.0.1", "MEMRL_PORT": str(port), "MEMRL_TOKENS_FILE": "/run/secrets/tokens"},
        volumes={volume: {"bind": "/data", "mode": "rw"}, str(tokens): {"bind": "/run/secrets/tokens", "mode": "ro"}},
        healthcheck={"interval": 1_000_000_000, "timeout": 5_000_000_000, "retries": 60},  # the image's test
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
    )
    base, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/mcp"
    try:
        wait_healthy(container)
        assert container.exec_run(["id", "-u"]).output.decode().strip() == str(APP_UID)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/health")).status_code == 200
            assert (await http.post("/mcp", json={})).status_code == 401  # no token
        with anyio.fail_after(120):
            async with mcp_client(url, TOKEN) as client:
                stored = await call(client, "store_experience", task=TASK, experience="logrotate, daily, compress")
                recall = await call(client, "recall_experience", task=TASK)
                assert [m["id"] for m in recall["memories"]] == [stored["id"]]
                report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
                assert [c["id"] for c in report["updated"]] == [stored["id"]]

        container.restart(timeout=30)
        wait_healthy(container)
        with anyio.fail_after(120):
            async with mcp_client(url, TOKEN) as client:
                recall = await call(client, "recall_experience", task=TASK)
                (memory,) = recall["memories"]
                assert memory["id"] == stored["id"] and memory["visits"] == 1 and memory["q"] > 0
    finally:
        container.remove(force=True)
