"""The operators' HTTP routes beside the MCP endpoint: ``/health`` (liveness), ``/metrics`` (Prometheus) and
``/stats`` (memory_stats as plain JSON, for dashboards). With tokens, ``/metrics`` and ``/stats`` require one."""

from __future__ import annotations

import anyio.to_thread
from mcp.server import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import StatsQuery
from memrl_mcp.surface.auth import TokenTable, caller
from memrl_mcp.surface.observability import Metrics

TOKEN_MISSING = {"error": "invalid_token", "error_description": "a bearer token is required"}


def mount(server: MCPServer, service: MemoryService, tokens: TokenTable | None, metrics: Metrics) -> None:
    """Add the routes to ``server``'s HTTP app."""

    async def health(request: Request) -> Response:
        """Liveness for load balancers and service managers: no token needed, nothing private."""
        return JSONResponse({"status": "ok"})

    async def prometheus(request: Request) -> Response:
        """Prometheus text format: tool calls, latency, memories, write conflicts (no tenant data). With tokens,
        a scraper needs one too: the totals span every tenant."""
        if caller(request, tokens) is None:
            return JSONResponse(TOKEN_MISSING, 401)
        text = await anyio.to_thread.run_sync(metrics.exposition)  # counts memories: a store call
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_stats(request: Request) -> Response:
        """memory_stats over plain HTTP (``?namespace=``), for dashboards; scoped by the bearer token."""
        access = caller(request, tokens)
        if access is None:
            return JSONResponse(TOKEN_MISSING, 401)
        query = StatsQuery(request.query_params.get("namespace"))
        try:
            stats = await anyio.to_thread.run_sync(lambda: service.stats(query, access=access))
        except MemoryRequestError as error:
            return JSONResponse({"error": "bad_request", "error_description": str(error)}, 400)
        return Response(stats.model_dump_json(), media_type="application/json")

    server.custom_route("/health", methods=["GET"])(health)
    server.custom_route("/metrics", methods=["GET"])(prometheus)
    server.custom_route("/stats", methods=["GET"])(http_stats)
