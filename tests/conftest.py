"""Shared fixtures: one real embedder per session, a fresh real store per test, both engines; and the two tiers.

``make test`` runs every test. ``make test-fast`` runs those not marked ``slow``, in process, in a few minutes: a
module that needs a service or a build (MariaDB, a Docker engine, chromium, the sandboxes, the local LLM, a wheel)
marks itself; a test that starts a server process, kills a child or mounts a filesystem is marked here; and a test run
on both embedded engines runs on qdrant-edge only (qdrant-client's local mode is the fallback engine; the full suite
keeps the two in step)."""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder, MiniLMEmbedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.serving.tools import create_server
from tests.support.mcp import make_service
from tests.support.servers import ONE_PROCESS

os.environ.update(ONE_PROCESS)  # memrl-mcp processes spawned with this environment as well (child_env sets it too)

PROCESSES = ("http_server(", "stdio_server(", "run_cli(", "subprocess.", "small_disk(", "seeded_server(", "os.kill(")
"""What a test calls when it starts a server process, a child that it kills, or a filesystem it mounts: seconds each,
left to the full suite."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast tier's cut (module docstring): tests on the second engine, and tests that start processes, are slow."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("engine") == "qdrant-local":
            item.add_marker(pytest.mark.slow)
        function = getattr(item, "function", None)
        if function is not None and any(call in inspect.getsource(function) for call in PROCESSES):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return MiniLMEmbedder()


@pytest.fixture(params=["edge", "qdrant-local"])
def engine(request: pytest.FixtureRequest) -> str:
    """Every test that takes this runs on both embedded engines (one shared suite)."""
    return request.param


@pytest.fixture
def service(embedder: Embedder, tmp_path: Path, engine: str) -> Iterator[MemoryService]:
    svc = make_service(embedder, tmp_path / "data", engine)
    yield svc
    svc.close()


@pytest.fixture
async def client(service: MemoryService) -> AsyncIterator[Client]:
    async with Client(create_server(service)) as mcp_client:
        yield mcp_client
