"""The HTTP transports, served safely: bearer tokens, no open bind, DNS-rebinding protection kept, each request in
a context of its own, and a quota of open sessions (SSE streams) per token so that one tenant cannot lock the
others out."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

import anyio
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import ServingSettings, Settings, SettingsError, load_grants
from memrl_mcp.surface.asking import OpenQuestions
from memrl_mcp.surface.auth import TokenTable, is_loopback, refusal
from memrl_mcp.surface.observability import Metrics
from memrl_mcp.surface.server import create_server
from memrl_mcp.transports import inspector, routes
from memrl_mcp.transports.stdio import Bounds, run_session, stdio_streams

Transport = Literal["stdio", "streamable-http", "sse"]
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
GUARDED_ROUTES = ("/stats", "/metrics")  # /health stays open: it says nothing but "ok"
MCP_PATH = "/mcp"
SSE_PATH = "/sse"
TOKEN_ROUTES = (MCP_PATH, SSE_PATH, "/messages/", *GUARDED_ROUTES, "/ui/api/")
"""Routes that need a token (a path, or a prefix ending in /); the others (/, /health, /ui's page and assets, and
whatever is not found) say nothing private."""
ANONYMOUS = ""  # the one tenant of a server without tokens (loopback only)
log = logging.getLogger(__name__)


def tokens_for(settings: ServingSettings, transport: Transport, host: str) -> TokenTable | None:
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


UVICORN_OPTIONS: dict[str, Any] = {"log_config": None, "access_log": False, "reset_contextvars": True}
"""How uvicorn serves the app: our handlers' format for its own logs; the per-call JSON log replaces its access log.
Each request starts from an empty context: by default uvicorn's request task copies the context of whatever callback
read its bytes, which after a large body or a pipelined request is the previous request's task (see
docs/security.md, "Identity per request")."""


def serve(service: MemoryService, transport: Transport, host: str, port: int, tokens: TokenTable | None) -> None:
    """Run until interrupted; the caller closes the service."""
    if transport == "stdio":
        bounds = Bounds.of(service.settings.serving)
        anyio.run(run_session, create_server(service, single_client=True), stdio_streams(bounds))
        return
    import uvicorn

    uvicorn.run(http_app(service, transport, host, tokens), host=host, port=port, **UVICORN_OPTIONS)


def http_app(
    service: MemoryService,
    transport: Transport,
    host: str,
    tokens: TokenTable | None,
    settings: Settings | None = None,
    questions: OpenQuestions | None = None,
) -> ASGIApp:
    """The ASGI app of an MCP server over ``service`` on an HTTP transport (not stdio), bound on ``host``: the MCP
    endpoint with its quotas and host checks, and beside it the operators' routes (:mod:`~memrl_mcp.transports.routes`)
    and the inspector (:mod:`~memrl_mcp.transports.inspector`), which count and show what the same server serves.
    ``settings`` and ``questions``: those of its clients when they are not the service's, and the open questions it
    shares with other servers over the service (the local server's HTTP sessions, as
    :func:`~memrl_mcp.surface.server.create_server` says)."""
    metrics = Metrics(service)
    server = create_server(service, tokens, settings=settings, metrics=metrics, questions=questions)
    routes.mount(server, service, tokens, metrics)  # /health, /metrics, /stats
    inspector.mount(server, service, tokens)  # the /ui page and its JSON API
    serving = (settings or service.settings).serving
    security = transport_security(host, serving.allowed_hosts)
    endpoint = SSE_PATH if transport == "sse" else MCP_PATH
    server.custom_route("/", methods=["GET"], include_in_schema=False)(home(transport, endpoint))
    per_token = serving.max_sessions_per_token
    app: ASGIApp
    if transport == "sse":
        app = StreamQuota(server.sse_app(transport_security=security, host=host), tokens, per_token)
    else:
        tenants = len(tokens) if tokens is not None else 1
        # Every tool answers once: a plain JSON answer costs the server less than an SSE stream per call. The
        # SDK's own limit (all sessions) is set so that only the per-token quota can ever be reached.
        app = SessionQuota(
            server.streamable_http_app(
                json_response=True,
                transport_security=security,
                host=host,
                session_idle_timeout=serving.session_idle_seconds,
                max_sessions=per_token * tenants,
            ),
            server.session_manager,
            tokens,
            per_token,
            serving.session_idle_seconds,
        )
    if tokens is not None:
        app = TokenCheck(app, tokens)
    return HostCheck(app, security)


def home(transport: Transport, endpoint: str) -> Callable[[Request], Awaitable[Response]]:
    """``GET /``: where things are, for whoever opens the server's address in a browser (nothing private)."""
    text = (
        f"memrl-mcp: an MCP server of an episodic memory that learns from rewards.\n\n"
        f"MCP endpoint ({transport}): {endpoint}\nInspector (what the memory learned): /ui\nHealth: /health\n"
    )

    async def answer(request: Request) -> Response:
        return PlainTextResponse(text)

    return answer


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


class TokenCheck:
    """A request to a route that needs a token (:data:`TOKEN_ROUTES`) without a valid one is answered here, the same
    way on every such route (:func:`~memrl_mcp.surface.auth.refusal`: RFC 6750's ``invalid_token``, saying what is
    wrong), before the SDK's transports or the server's routes see it."""

    def __init__(self, app: ASGIApp, tokens: TokenTable) -> None:
        self.app = app
        self._tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _needs_token(scope["path"]):
            problem = await self._tokens.problem(_header(scope["headers"], "authorization"))
            if problem is not None:
                await refusal(problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _needs_token(path: str) -> bool:
    return any(path.startswith(route) if route.endswith("/") else path == route for route in TOKEN_ROUTES)


class _TenantQuota(ABC):
    """What the session and stream quotas share: a request's tenant, read from its own Authorization header (this
    runs in front of the SDK's authentication), and the refusal. Without tokens (a loopback-only server) every
    client is the same tenant: there is no boundary between local clients to protect, since each may use every
    namespace anyway."""

    def __init__(self, app: ASGIApp, tokens: TokenTable | None, per_token: int) -> None:
        self.app = app
        self._tokens = tokens
        self._per_token = per_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = await self._tenant(scope) if scope["type"] == "http" and self._opens(scope) else None
        if tenant is None:  # opens nothing; or no or a bad token, which the SDK answers with 401
            await self.app(scope, receive, send)
            return
        await self._admit(tenant, scope, receive, send)

    @abstractmethod
    def _opens(self, scope: Scope) -> bool:
        """Whether the HTTP request of ``scope`` would open what the quota counts."""

    @abstractmethod
    async def _admit(self, tenant: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request of ``tenant`` that opens what the quota counts, or refuse it."""

    async def _tenant(self, scope: Scope) -> str | None:
        """The token's name; None for no or a bad token, which passes through to the SDK's 401."""
        if self._tokens is None:
            return ANONYMOUS
        authorization = _header(scope["headers"], "authorization") or ""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        access = await self._tokens.verify_token(token.strip())
        return None if access is None else access.client_id

    def _refusal(self, tenant: str, what: str, held: int, advice: str, headers: dict[str, str]) -> Response:
        log.warning("refused: tenant %r holds %d %s", tenant or "(no token)", held, what)
        message = f"too many open {what} for this token: {held} of max_sessions_per_token={self._per_token}. {advice}"
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
        return Response(json.dumps(body), status_code=429, headers=headers, media_type="application/json")


class SessionQuota(_TenantQuota):
    """At most ``per_token`` open streamable-HTTP sessions per tenant (token), in front of the SDK's app.

    The SDK limits sessions only in total (10,000 by default, idle ones closed after 30 minutes): one token
    opening that many locked every other client out. Here a request that would open a session (one without
    ``Mcp-Session-Id``) is refused with 429 once its tenant holds ``per_token`` sessions, counting those being
    opened; the SDK's total is set to ``per_token`` times the number of tokens, so it is never what refuses a
    tenant under its quota.

    A session is counted from the answer that opened it (its ``Mcp-Session-Id``) until the SDK forgets it (a
    DELETE, the idle timeout, the server's end); whether it still lives is read from the session manager's table
    of sessions, the SDK's one record of it. Requests with an invalid token pass through to the SDK's 401.
    """

    def __init__(
        self,
        app: ASGIApp,
        manager: StreamableHTTPSessionManager,
        tokens: TokenTable | None,
        per_token: int,
        idle_seconds: float,
    ) -> None:
        super().__init__(app, tokens, per_token)
        self._manager = manager
        self._idle_seconds = idle_seconds
        self._open: defaultdict[str, set[str]] = defaultdict(set)
        self._opening: Counter[str] = Counter()

    def _opens(self, scope: Scope) -> bool:
        return scope["path"] == MCP_PATH and _header(scope["headers"], MCP_SESSION_ID_HEADER) is None

    async def _admit(self, tenant: str, scope: Scope, receive: Receive, send: Send) -> None:
        # No await between counting and reserving: the event loop cannot interleave another opening here.
        live = {session for session in self._open[tenant] if session in self._manager._server_instances}
        self._open[tenant] = live
        if len(live) + self._opening[tenant] >= self._per_token:
            advice = (
                f"End sessions you no longer use (HTTP DELETE with their {MCP_SESSION_ID_HEADER}); idle ones close "
                f"after {self._idle_seconds:g} s"
            )
            retry = {"Retry-After": str(max(1, round(self._idle_seconds)))}
            await self._refusal(tenant, "sessions", len(live), advice, retry)(scope, receive, send)
            return
        self._opening[tenant] += 1
        reserved = True

        async def watch(message: Message) -> None:
            nonlocal reserved
            if message["type"] == "http.response.start" and reserved:
                session = _header(message.get("headers", []), MCP_SESSION_ID_HEADER)
                if message["status"] < 400 and session is not None:
                    self._open[tenant].add(session)
                self._opening[tenant] -= 1
                reserved = False
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if reserved:
                self._opening[tenant] -= 1


class StreamQuota(_TenantQuota):
    """At most ``per_token`` open legacy-SSE streams per tenant, in front of the SDK's SSE app: the same quota as
    :class:`SessionQuota`'s, for the transport whose session is a stream.

    The SDK's SSE transport has no limit of its own. A stream
    lives exactly while its ``GET /sse`` is being answered: it is counted from the moment that request arrives
    (so that concurrent openings cannot overshoot) until the SDK's handler returns, which it does when the client
    goes away (the SSE response notices the disconnection) or the server stops. There is no idle timeout: a held
    stream is the client's to close. Messages (``POST /messages/``) open nothing and are not counted.
    """

    def __init__(self, app: ASGIApp, tokens: TokenTable | None, per_token: int) -> None:
        super().__init__(app, tokens, per_token)
        self._open: Counter[str] = Counter()

    def _opens(self, scope: Scope) -> bool:
        return bool(scope["path"] == SSE_PATH and scope["method"] == "GET")

    async def _admit(self, tenant: str, scope: Scope, receive: Receive, send: Send) -> None:
        if self._open[tenant] >= self._per_token:  # no await between counting and taking a place
            advice = f"Close the streams you no longer use: each GET {SSE_PATH} holds one until it ends"
            await self._refusal(tenant, "SSE streams", self._open[tenant], advice, {})(scope, receive, send)
            return
        self._open[tenant] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._open[tenant] -= 1


def _header(headers: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    """A header of an ASGI request scope or response start (names are lower case in both)."""
    wanted = name.lower().encode("latin-1")
    return next((value.decode("latin-1") for key, value in headers if key == wanted), None)
