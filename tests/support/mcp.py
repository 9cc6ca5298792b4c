"""Calling tools through the real MCP client, and opening a real service over a fresh store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, types
from mcp.types import (
    CallToolResult,
    GetPromptResult,
    ReadResourceResult,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)

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


def text_of(result: CallToolResult) -> str:
    """The first content block of a tool's answer, which is text."""
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


def prompt_text(result: GetPromptResult) -> str:
    """The first message of a prompt, which is text."""
    content = result.messages[0].content
    assert isinstance(content, TextContent), content
    return content.text


def resource_text(result: ReadResourceResult) -> str:
    """A resource as read: memrl's resources are text (JSON)."""
    contents = result.contents[0]
    assert isinstance(contents, TextResourceContents), contents
    return contents.text


async def read_json(client: Client, uri: str) -> Any:
    """The JSON a memrl:// resource holds."""
    return json.loads(resource_text(await client.read_resource(uri)))


def hints(tool: Tool) -> ToolAnnotations:
    """A tool's annotations, which every tool of memrl-mcp has."""
    assert tool.annotations is not None, tool.name
    return tool.annotations


def make_service(embedder: Embedder, data_dir: Path, engine: str = "edge", **overrides: Any) -> MemoryService:
    """A service on a fresh store whose server offers every tool (``tool_profile: full``, unless overridden): the
    tests exercise them all; tests/test_agent_surface.py checks what the default profile offers. A reward reported
    moves Q by alpha (``model_reward_weight: 1``): the tests of the update rule report as the harness reports a
    checker's reward; tests/test_rewards.py holds the default weight of a model's word."""
    overrides = {"tool_profile": "full", "model_reward_weight": 1.0, **overrides}
    settings: Settings = load_settings(data_dir=data_dir, embedded_engine=engine, **overrides)
    return MemoryService.open(settings, embedder)


class Held:
    """A client whose user (or model) answers only once released: every question that reaches it is counted."""

    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.release = anyio.Event()

    async def user(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        await self.release.wait()
        return types.ElicitResult(action="accept", content={"succeeded": True})

    async def model(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.asked.append(params)
        await self.release.wait()
        text = types.TextContent(type="text", text="1. certbot renew. 2. Reload postfix.")
        return types.CreateMessageResult(role="assistant", content=text, model="m")
