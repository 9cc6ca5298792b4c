"""Shared fixtures: one real embedder per session, a fresh real store per test, both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder, MiniLMEmbedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.serving.tools import create_server
from memrl_mcp.settings import Settings, load_settings


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its typed result arrives as structured content."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must be refused; the message the client sees."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


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


def make_service(embedder: Embedder, data_dir: Path, engine: str = "edge", **overrides: Any) -> MemoryService:
    """A service on a fresh store whose server offers every tool (``tool_profile: full``, unless overridden): the
    tests exercise them all; tests/test_agent_surface.py checks what the default profile offers."""
    overrides = {"tool_profile": "full"} | overrides
    settings: Settings = load_settings(data_dir=data_dir, embedded_engine=engine, **overrides)
    return MemoryService.open(settings, embedder)


@pytest.fixture
def service(embedder: Embedder, tmp_path: Path, engine: str) -> Iterator[MemoryService]:
    svc = make_service(embedder, tmp_path / "data", engine)
    yield svc
    svc.close()


@pytest.fixture
async def client(service: MemoryService) -> AsyncIterator[Client]:
    async with Client(create_server(service)) as mcp_client:
        yield mcp_client
