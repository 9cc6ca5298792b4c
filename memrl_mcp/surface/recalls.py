"""The resource ``memrl://recalls/{recall_id}``: whether a recall still waits for its report.

A program that made a recall for an agent checks here whether the agent reported it: the Claude Code plugin's Stop
hook (:mod:`memrl_mcp.clients.core`) holds the session only for a recall that is still pending. Read-only, and
scoped like the other resources: a recall outside the namespaces of the reader's token is as unknown as one never
issued."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.service import MemoryService

RECALL_URI = "memrl://recalls/{recall_id}"


Reader = Callable[[Context[Any, Any]], Awaitable[Access]]
"""What the caller of a resource read may see (the server's :class:`~memrl_mcp.surface.server.Callers`)."""


def add_recall_resource(server: MCPServer, service: MemoryService, reader: Reader) -> None:
    """Offer :data:`RECALL_URI` on ``server``; ``reader`` says what the caller of a read may see."""

    @server.resource(
        RECALL_URI,
        name="recall",
        mime_type="application/json",
        description="One recall: its task, how many memories it returned, and whether it still waits for its "
        "report (status pending) or was reported.",
    )
    async def recall(recall_id: str, ctx: Context[Any, Any]) -> str:
        access = await reader(ctx)
        try:
            state = await anyio.to_thread.run_sync(lambda: service.recall_state(recall_id, access=access))
            return state.model_dump_json()
        except MemoryRequestError as error:
            raise ResourceError(str(error)) from None
