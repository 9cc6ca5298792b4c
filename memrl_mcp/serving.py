"""The HTTP transports, served safely: bearer tokens, no open bind, DNS-rebinding protection kept."""

from __future__ import annotations

from typing import Literal

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from memrl_mcp.auth import TokenTable, is_loopback, load_grants
from memrl_mcp.memory import MemoryService
from memrl_mcp.server import create_server
from memrl_mcp.settings import Settings, SettingsError

Transport = Literal["stdio", "streamable-http", "sse"]
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
GUARDED_ROUTES = ("/stats", "/metrics")  # /health stays open: it says nothing but "ok"


def tokens_for(settings: Settings, transport: Transport, host: str) -> TokenTable | None:
    """The tokens the transport will require (None: no token). An HTTP server reachable from other machines
    without any token would hand every memory to anyone who can reach the port: refused."""
    if transport == "stdio":
        return None
    grants = load_grants(settings)
    if not grants and not is_loopback(host):
        raise SettingsError(
            f"refusing to serve on {host} without a token: anyone who reaches the port could read and change "
            "every memory. Set tokens (MEMRL_TOKENS, or tokens_file) or bind 127.0.0.1."
        )
    return TokenTable(grants) if grants else None


def transport_security(host: str, allowed_hosts: list[str]) -> TransportSecuritySettings:
    """Host and Origin headers accepted: loopback, the bound address (unless a wildcard), and ``allowed_hosts``.
    The SDK leaves the check off for non-loopback binds; it stays on here."""
    hosts = [f"{name}:*" for name in LOOPBACK_HOSTS]
    if host not in ("0.0.0.0", "::", "") and not is_loopback(host):
        hosts.append(f"[{host}]:*" if ":" in host else f"{host}:*")
    hosts += allowed_hosts
    origins = [f"{scheme}://{name}" for name in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def serve(service: MemoryService, transport: Transport, host: str, port: int, tokens: TokenTable | None) -> None:
    """Run until interrupted; the caller closes the service."""
    server = create_server(service, tokens)
    if transport == "stdio":
        server.run()
        return
    import uvicorn

    security = transport_security(host, service.settings.allowed_hosts)
    if transport == "sse":
        app = server.sse_app(transport_security=security, host=host)
    else:
        # Every tool answers once: a plain JSON answer costs the server less than an SSE stream per call.
        app = server.streamable_http_app(json_response=True, transport_security=security, host=host)
    # Our handlers' format for uvicorn's own logs; the per-call JSON log replaces its access log.
    uvicorn.run(HostCheck(app, security), host=host, port=port, log_config=None, access_log=False)


class HostCheck:
    """DNS-rebinding protection for the operators' routes too: the SDK checks only its MCP endpoints, and a
    page that rebinds its name to 127.0.0.1 could otherwise read ``/stats`` of a server without tokens."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings) -> None:
        self.app = app
        self._guard = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in GUARDED_ROUTES:
            refusal = await self._guard.validate_request(Request(scope, receive))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)
