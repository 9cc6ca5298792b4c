"""``memrl-mcp local serve`` (``make serve``): streamable HTTP served by the user's local server of the store, so
that an HTTP client and every stdio session share one store and one live memory, whichever starts first. Real
processes and real MCP clients (the SDK's, over stdio and over HTTP); each test has a runtime folder of its own."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.support.local import LocalStore, local_store, servers_of
from tests.support.mcp import call
from tests.support.servers import CLI, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # every test starts a local server
START_S = 120.0  # a cold start of the local server on a loaded machine


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    with local_store(tmp_path) as found:
        yield found


@contextmanager
def local_serve(store: LocalStore, port: int, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``memrl-mcp local serve --port PORT`` as a user runs it, until it listens; SIGTERM at the end."""
    log = tmp_path / f"serve-{port}.log"
    with log.open("w") as out:
        command = subprocess.Popen(
            [*CLI, "local", "serve", "--port", str(port)],
            env=store.env(),
            cwd=store.data_dir.parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            text=True,
        )
    try:
        deadline = time.monotonic() + START_S
        while not listening(port):
            assert command.poll() is None, f"local serve exited with {command.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"nothing listens on port {port}: {log.read_text()}"
            time.sleep(0.05)
        yield command
    finally:
        if command.poll() is None:
            command.terminate()
            command.wait(timeout=30)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@asynccontextmanager
async def http_session(port: int) -> AsyncIterator[Client]:
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client())
        url = f"http://127.0.0.1:{port}/mcp"
        yield await stack.enter_async_context(Client(streamable_http_client(url, http_client=http)))


async def lessons(client: Client, task: str) -> list[str]:
    recalled = await call(client, "recall_experience", task=task)
    return [memory["experience"] for memory in recalled["memories"]]


async def test_http_first_then_stdio_share_one_memory_and_stopping_http_leaves_stdio(
    store: LocalStore, tmp_path: Path
) -> None:
    """`local serve` first (it starts the local server), then a stdio session: what either stores the other
    recalls, on one server; a second `local serve` on the taken port fails naming it; stopping the first (SIGTERM)
    closes the port and leaves the stdio session working."""
    port = free_port()
    with local_serve(store, port, tmp_path) as command:
        async with http_session(port) as over_http:
            await call(over_http, "store_experience", task="deploy the web app", experience="over http")
            async with Client(store.session()) as over_stdio:
                assert "over http" in await lessons(over_stdio, "deploy the web app")
                await call(over_stdio, "store_experience", task="rotate the nightly logs", experience="over stdio")
                assert "over stdio" in await lessons(over_http, "rotate the nightly logs")
                assert len(servers_of(store.runtime_dir)) == 1

                second = subprocess.run(
                    [*CLI, "local", "serve", "--port", str(port)],
                    env=store.env(),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert second.returncode == 2
                assert f"port {port}" in second.stderr and "in use" in second.stderr, second.stderr

                command.send_signal(signal.SIGTERM)
                assert command.wait(timeout=30) == 0
                deadline = time.monotonic() + 30
                while listening(port):
                    assert time.monotonic() < deadline, f"port {port} still served after the command ended"
                    time.sleep(0.05)
                assert "over http" in await lessons(over_stdio, "deploy the web app")
                while (status := store.status()) is None or status.sessions != 1:  # the command's leave, noted
                    assert time.monotonic() < deadline, f"the server still counts {status} after the command ended"
                    await anyio.sleep(0.05)


async def test_stdio_first_then_http_and_the_command_counts_as_a_session(store: LocalStore, tmp_path: Path) -> None:
    """A stdio session first (it starts the local server), then `local serve`: the HTTP client recalls what the
    stdio session stored and the other way round; while it runs the command is one of the server's sessions, and
    Ctrl-C ends it."""
    port = free_port()
    async with Client(store.session()) as over_stdio:
        await call(over_stdio, "store_experience", task="deploy the web app", experience="over stdio")
        with local_serve(store, port, tmp_path) as command:
            assert store.status().sessions == 2  # type: ignore[union-attr]
            async with http_session(port) as over_http:
                assert "over stdio" in await lessons(over_http, "deploy the web app")
                await call(over_http, "store_experience", task="rotate the nightly logs", experience="over http")
            assert "over http" in await lessons(over_stdio, "rotate the nightly logs")
            command.send_signal(signal.SIGINT)
            assert command.wait(timeout=30) == 0
        assert not listening(port)
        assert "over http" in await lessons(over_stdio, "rotate the nightly logs")
    assert len(servers_of(store.runtime_dir)) == 1


@pytest.mark.parametrize(("variable", "value"), [("MEMRL_TOKENS", "[]"), ("MEMRL_HOST", "0.0.0.0")])
def test_tokens_or_an_open_host_are_refused_before_any_server_starts(
    store: LocalStore, variable: str, value: str
) -> None:
    """The local server's HTTP is loopback only and has no tokens: settings that ask for either are refused by
    name, and no server is started for them."""
    if variable == "MEMRL_TOKENS":
        value = '[{"name": "alice", "token": "alice-token-0123456789", "namespaces": ["alice"]}]'
    done = subprocess.run(
        [*CLI, "local", "serve", "--port", str(free_port())],
        env=store.env(**{variable: value}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert ("tokens" if variable == "MEMRL_TOKENS" else "0.0.0.0") in done.stderr, done.stderr
    assert "--no-attach" in done.stderr
    assert store.status() is None
