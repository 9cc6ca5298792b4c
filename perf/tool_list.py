"""What an agent pays for the memory's tools: the size of ``tools/list`` per tool profile and per tool.

The list is read through the real MCP client from a server in this process, and measured as a client forwards it
to its model: each tool as compact JSON (name, title, description, input schema, annotations). About 4 characters
make a token. The default profile's list must stay within 8 KB (tests/test_agent_surface.py).

    .venv/bin/python perf/tool_list.py            # every profile, with each tool's share
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import TOOL_PROFILES, load_settings
from memrl_mcp.surface.server import create_server


def compact(value: Any) -> int:
    """Characters of ``value`` as compact JSON (the tools are ASCII: characters are bytes)."""
    return len(json.dumps(value, separators=(",", ":")))


async def listed_tools(profile: str, data_dir: Path) -> list[dict[str, Any]]:
    """The tools of ``profile`` as the client receives them, as JSON objects."""
    service = MemoryService.open(load_settings(data_dir=data_dir, tool_profile=profile), MiniLMEmbedder())
    try:
        async with Client(create_server(service)) as client:
            tools = (await client.list_tools()).tools
    finally:
        service.close()
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=sorted(TOOL_PROFILES), action="append", help="default: every one")
    profiles = parser.parse_args().profile or list(TOOL_PROFILES)
    with tempfile.TemporaryDirectory() as folder:
        for profile in profiles:
            tools = await listed_tools(profile, Path(folder) / profile)
            print(f"{profile}: {compact({'tools': tools})} characters, {len(tools)} tools")
            for tool in tools:
                parts = {key: compact(tool.get(key)) for key in ("description", "inputSchema")}
                print(
                    f"  {tool['name']:<20} {compact(tool):>5}  (description {parts['description']}, "
                    f"input schema {parts['inputSchema']})"
                )


if __name__ == "__main__":
    anyio.run(main)
