"""Calling tools through the real MCP client, and opening a real service over a fresh store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.service import MemoryService
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


def make_service(embedder: Embedder, data_dir: Path, engine: str = "edge", **overrides: Any) -> MemoryService:
    """A service on a fresh store whose server offers every tool (``tool_profile: full``, unless overridden): the
    tests exercise them all; tests/test_agent_surface.py checks what the default profile offers."""
    overrides = {"tool_profile": "full"} | overrides
    settings: Settings = load_settings(data_dir=data_dir, embedded_engine=engine, **overrides)
    return MemoryService.open(settings, embedder)
