"""The real memrl-mcp process: its environment, stdio and HTTP servers a test starts and stops, the CLI, and the
tokens and clients of the HTTP tests."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {
    "recall_experience",
    "search_experience",
    "report_outcome",
    "store_experience",
    "forget_experience",
    "memory_stats",
    "recall_step_advice",
    "report_trajectory",
    "list_memories",
    "update_memory",
    "record_evidence",
}


DEADLINE_S = 60  # a whole test body; the server answers in milliseconds once started


START_TIMEOUT_S = 30.0  # an HTTP server's start (it loads the embedder first)


CLI = [sys.executable, "-m", "memrl_mcp.cli"]


ONE_PROCESS = {"MEMRL_ATTACH": "false", "MEMRL_MODEL_REWARD_WEIGHT": "1"}
"""The suite's defaults: a stdio server the tests spawn opens its store itself, one process per test that dies with
its client, as before the local server existed (tests/test_local*.py attach, each to a runtime folder of its own);
and a reported reward moves Q by alpha, as make_service's (tests/test_rewards.py holds the product's weight)."""


def child_env(data_dir: Path | None = None, /, **variables: str) -> dict[str, str]:
    """This process's environment without any setting of the user's (MEMRL_*, CLAUDE_PROJECT_DIR), plus the suite's
    default (:data:`ONE_PROCESS`) and the test's own variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEMRL_")} | ONE_PROCESS
    env.pop("CLAUDE_PROJECT_DIR", None)  # read as project_dir: a suite run inside Claude Code would name a project
    if data_dir is not None:
        env["MEMRL_DATA_DIR"] = str(data_dir)
    env.update(variables)
    return env


EVERY_TOOL = {"MEMRL_TOOL_PROFILE": "full"}
"""The servers the tests spawn offer every tool, unless a test says otherwise (tests/test_agent_surface.py checks
the default profile)."""


def stdio_server(data_dir: Path, **variables: str) -> StdioServerParameters:
    return StdioServerParameters(command=CLI[0], args=CLI[1:], env=child_env(data_dir, **EVERY_TOOL | variables))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class HttpServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path


@contextmanager
def http_server(
    data_dir: Path, tmp_path: Path, transport: str = "streamable-http", **variables: str
) -> Iterator[HttpServer]:
    """A ``memrl-mcp --transport streamable-http`` (or sse) child on 127.0.0.1, stopped with SIGTERM (as a
    service manager would) when the block ends."""
    port = free_port()
    log_path = tmp_path / f"http-server-{port}.log"
    args = ["--transport", transport, "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*CLI, *args], env=child_env(**EVERY_TOOL | variables), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"HTTP server exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"HTTP server not listening after {START_TIMEOUT_S} s:\n{log_path.read_text()}")
                time.sleep(0.05)
        yield HttpServer(f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}", proc, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def run_cli(*args: str, env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``memrl-mcp`` with stdin closed (an stdio server would see EOF at once) and capture its output."""
    return subprocess.run(
        [*CLI, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


ALICE, BOB = "alice-token-0123456789", "bob-token-abcdefghijkl"


INITIALIZE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def tokens_file(tmp_path: Path) -> Path:
    """alice's token in clear; bob's only as its SHA-256, as an operator keeping secrets out of files would."""
    path = tmp_path / "tokens.yaml"
    grants = [
        {"name": "alice", "token": ALICE, "namespaces": ["alice"]},
        {"name": "bob", "token_sha256": hashlib.sha256(BOB.encode()).hexdigest(), "namespaces": ["bob", "shared"]},
    ]
    path.write_text(yaml.safe_dump({"tokens": grants}))
    return path


@asynccontextmanager
async def mcp_client(server: HttpServer, token: str | None, **options: Any) -> AsyncIterator[Client]:
    """A client of ``server`` with ``token``; ``options`` of the SDK's Client (its callbacks, its protocol mode)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        yield await stack.enter_async_context(Client(streamable_http_client(server.url, http_client=http), **options))


def base_url(server: HttpServer) -> str:
    return server.url.rsplit("/", 1)[0]
