"""The inspector: a page at ``/ui`` on the HTTP server itself, to see what the memory learned and correct it.

The page (``memrl_mcp/transports/ui/``: one HTML file, one script, one style sheet, no framework, nothing fetched from
elsewhere) talks to a small JSON API under ``/ui/api/``. The API is a thin adapter over the public
:class:`~memrl_mcp.memory.service.MemoryService` methods, under the same rules as every other route:

- **Tenants.** A request carries its bearer token in an ``Authorization`` header (the page keeps it in
  ``sessionStorage`` at most, never in a cookie), and sees only its token's namespaces. A server without tokens
  is a loopback-only server (``http.tokens_for`` refuses any other bind); there the page needs no token, and a
  request must name a loopback host, so a DNS-rebound page cannot read it.
- **No cross-site writes.** A change is a ``PATCH`` or ``DELETE`` with a JSON body: a form cannot send either,
  and another site's script can only after a CORS preflight that this server never grants. On top, a change
  whose ``Origin`` or ``Sec-Fetch-Site`` says another site sent it is refused.
- **Untrusted text.** Tasks, experiences and metadata come from agents and LLMs. The script renders them with
  ``textContent`` only, and every answer carries a Content-Security-Policy without inline script, so even
  a missed spot could not run one.

"Why this memory?" (:func:`preview`) shows the service's scored pool (:meth:`MemoryService.pool`: Phase A and B as a
recall computes them, through the read-only path; nothing is logged as a recall) and says why each candidate was
chosen or not. Learning curves are read from the ``curve.json`` of harness run folders (the ``ui_runs`` setting;
:mod:`memrl_mcp.curves`) and drawn by the page.

A memory's page says who wrote its experience (the agent, the client's model, the server's endpoint, an operator
here) and, for each change of its Q, who gave the reward (the agent, or the user the server asked, with the user's
note): :mod:`memrl_mcp.surface.feedback` records both.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from mcp.server import MCPServer
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from memrl_mcp.curves import curves, run_folders
from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import EffectiveSettings, PoolCandidate
from memrl_mcp.requests import ForgetRequest, ListQuery, MemoryEdit, RecallQuery, StatsQuery
from memrl_mcp.surface.auth import TokenTable, caller, is_loopback
from memrl_mcp.validation import MAX_METADATA_DEPTH, plain_error

PREFIX = "/ui"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_BODY_BYTES = 1 << 20  # a JSON body: an edit is at most an experience and metadata (tens of KB)
SAME_SITE_FETCHES = ("same-origin", "none")

Handler = Callable[[Request, Access], Awaitable[Response]]


class RefusalError(MemrlError):
    """An HTTP refusal: status, a short code and a message that names the field."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


# -- why this memory? ------------------------------------------------------------------------------


class PreviewCandidate(PoolCandidate):
    """A candidate of the pool, ranked both ways, and why it was chosen or not."""

    similarity_rank: int = Field(description="1 = most similar (Phase A's order).")
    score_rank: int
    reason: str


class Preview(BaseModel):
    """A recall's choice, shown and explained, without a recall: no recall id, no Q will move."""

    namespace: str
    k1: int
    k2: int
    q_weight: float
    delta: float
    sim_normalization: str
    sim_mean: float
    sim_std: float
    epsilon: float = Field(description="A real recall explores with this probability (k2 drawn uniformly).")
    candidates: list[PreviewCandidate]


def _reason(chosen: bool, score_rank: int, similarity_rank: int, k2: int) -> str:
    if chosen and similarity_rank <= k2:
        return f"chosen: #{score_rank} by score, and among the {k2} most similar"
    if chosen:
        return f"chosen for its utility: #{score_rank} by score although only #{similarity_rank} by similarity"
    if similarity_rank <= k2:
        return f"displaced by higher utility: #{similarity_rank} by similarity but #{score_rank} by score (k2={k2})"
    return f"not chosen: #{score_rank} by score, below the top k2={k2}"


def preview(service: MemoryService, ask: RecallQuery, *, access: Access) -> Preview:
    """The service's scored pool for ``ask`` (:meth:`MemoryService.pool`: Phase A and B through the read-only path,
    without exploring), with each candidate's ranks and the reason it was chosen or not."""
    pool = service.pool(ask, access=access)
    query, candidates = pool.query, pool.candidates
    assert query.k1 is not None and query.k2 is not None and query.q_weight is not None and query.delta is not None
    by_score = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, -candidates[i].similarity, i))
    score_rank = {i: rank for rank, i in enumerate(by_score, 1)}
    scale = service.scale.z_similarity
    return Preview(
        namespace=pool.namespace,
        k1=query.k1,
        k2=query.k2,
        q_weight=query.q_weight,
        delta=query.delta,
        sim_normalization=scale.mode,
        sim_mean=scale.mean,
        sim_std=scale.std,
        epsilon=service.settings.retrieval.epsilon,
        candidates=[
            PreviewCandidate(
                **c.model_dump(),
                similarity_rank=i + 1,
                score_rank=score_rank[i],
                reason=_reason(c.chosen, score_rank[i], i + 1, query.k2),
            )
            for i, c in enumerate(candidates)
        ],
    )


# -- the session ----------------------------------------------------------------------------------


class Session(BaseModel):
    """What the page needs to know about its caller and the server."""

    namespaces: list[str] = Field(description="The namespaces the caller may see that exist (or are its token's).")
    default_namespace: str
    open_namespace: str = Field(
        description="The namespace the page opens on: the default one, or, when it holds no memory, the caller's "
        "namespace holding the most (an empty page would say nothing of a memory that holds some)."
    )
    every_namespace: bool = Field(description="The caller may use any namespace (a local caller, or a '*' token).")
    tokens: bool = Field(description="The server requires bearer tokens.")
    read_only: bool
    settings: EffectiveSettings
    q_history_size: int = Field(description="Changes of Q each memory keeps.")
    run_folders: int


def session_of(service: MemoryService, access: Access, tokens: bool) -> Session:
    """A token's own namespaces; for a caller who may use every namespace, the ones holding memories (one pass
    over the store: the page asks once per visit). Each one's memories are counted, the caller's own only, to open
    the page on one that holds some."""
    if access.namespaces is not None:
        held = Counter({name: service.stats(StatsQuery(name), access=access).memories for name in access.namespaces})
    else:
        held = Counter(memory.namespace for memory in service.memories())
    default = access.default or service.settings.namespaces.namespace
    fullest = min(held, key=lambda name: (-held[name], name), default=default)
    return Session(
        namespaces=sorted(set(held) | {default}),
        default_namespace=default,
        open_namespace=default if held[default] or not held[fullest] else fullest,
        every_namespace=access.namespaces is None,
        tokens=tokens,
        read_only=service.settings.serving.read_only,
        settings=service.effective_settings(),
        q_history_size=service.settings.learning.q_history_size,
        run_folders=len(run_folders(list(service.settings.serving.ui_runs))),
    )


# -- the routes -----------------------------------------------------------------------------------


class Forget(BaseModel):
    """A forget's body: an empty JSON object (a body that no form or simple request can send)."""

    model_config = ConfigDict(extra="forbid")


def _typed(model: type[Any], data: Any, strings: bool = False) -> Any:
    """``data`` as ``model``; ``strings``: a query string's values, each read as JSON reads its text."""
    adapter = TypeAdapter(model)
    try:
        return adapter.validate_strings(data) if strings else adapter.validate_python(data)
    except ValidationError as error:
        raise _bad_request(error) from None


def _bad_request(error: ValidationError) -> RefusalError:
    """The first problem, named by its field."""
    first = error.errors()[0]
    return RefusalError(400, "bad_request", plain_error(first, "" if first["loc"] else "body"))


def _json(model: BaseModel | dict[str, Any], status: int = 200) -> Response:
    body = model.model_dump_json() if isinstance(model, BaseModel) else json.dumps(model)
    return Response(body, status_code=status, media_type="application/json", headers=SECURITY_HEADERS)


def _refusal(refusal: RefusalError) -> Response:
    response = _json({"error": refusal.code, "error_description": str(refusal)}, refusal.status)
    if refusal.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return response


def _host_is_loopback(request: Request) -> bool:
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return is_loopback(name)


def _same_origin(request: Request) -> bool:
    """A change may come from this page or from a program, never from a page of another site."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in SAME_SITE_FETCHES:
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


async def _body(request: Request, model: type[Any], **path: str) -> Any:
    """The request's JSON body, with the fields its path names (``path``), as ``model``, or a refusal naming what is
    wrong: never more than :data:`MAX_BODY_BYTES` read into memory, and never a body the JSON parser could not
    survive. Parsed in a worker thread, so that the event loop (every other client's requests) does not wait: the
    costliest 1 MB body takes a noticeable fraction of a second to scan and parse (docs/performance.md)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise RefusalError(415, "unsupported_media_type", "content-type: a change is sent as application/json")
    raw = bytearray()
    async for chunk in request.stream():  # counted as it arrives: a body without Content-Length is bounded too
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise RefusalError(413, "too_large", f"body: at most {MAX_BODY_BYTES} bytes")
    return await anyio.to_thread.run_sync(_parsed, bytes(raw), model, path)


def _parsed(raw: bytes, model: type[Any], path: dict[str, str]) -> Any:
    deep = _too_deep(raw, model)
    if deep is not None:
        raise RefusalError(400, "bad_request", deep)
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as error:
        raise RefusalError(400, "bad_request", f"body: not UTF-8 ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise RefusalError(400, "bad_request", f"body: not JSON ({error.msg} at character {error.pos})") from None
    except ValueError as error:  # an integer of more digits than Python converts (4300)
        raise RefusalError(400, "bad_request", f"body: not JSON ({str(error).split(':')[0]})") from None
    if path and isinstance(data, dict):
        for name in set(path) & set(data):
            raise RefusalError(400, "bad_request", f"{name}: no such field (the path names it)")
        data = {**data, **path}
    return _typed(model, data)


JSON_TOKENS = re.compile(rb'"(?:[^"\\]+|\\.?)*(?:"|\Z)|[][{}]', re.DOTALL)
"""A JSON string (to its closing quote, or to the end of an unterminated one) or a bracket. Linear: the string's
loop stops only at a quote or the end, where its tail always matches, so the engine never backtracks."""
MAX_BODY_DEPTH = 1 + MAX_METADATA_DEPTH
"""The deepest body any API request has: an object holding metadata, itself at most MAX_METADATA_DEPTH deep."""


def _too_deep(raw: bytes, model: type[Any]) -> str | None:
    """The refusal of a body nested deeper than :data:`MAX_BODY_DEPTH`, naming the field that holds the nesting
    ("body" for the body itself, or for a key that is not one of ``model``'s); None for any other body.

    Read from the raw bytes before the parser sees them: Python's JSON parser recurses once per level and raised
    RecursionError, an HTTP 500 with a logged traceback, about 1,000 levels down (a 5,000-deep body does it)."""
    depth, key, is_object = 0, b"", False
    for token in JSON_TOKENS.finditer(raw):
        text = token.group()
        if text[:1] == b'"':
            if depth == 1:  # in the top object, the last string before a nested value is that value's key
                key = text
        elif text in (b"{", b"["):
            depth += 1
            is_object = is_object or (depth == 1 and text == b"{")
            if depth > MAX_BODY_DEPTH:
                field = key.decode("utf-8", "replace").strip('"') if is_object else ""
                if field in _field_names(model):
                    return f"{field}: JSON nested deeper than {MAX_BODY_DEPTH - 1} levels"
                return f"body: JSON nested deeper than {MAX_BODY_DEPTH} levels"
        else:
            depth -= 1
    return None


def _field_names(model: type[Any]) -> set[str]:
    """The fields of a pydantic model or of a dataclass."""
    return set(getattr(model, "model_fields", None) or getattr(model, "__dataclass_fields__", {}))


def mount(server: MCPServer, service: MemoryService, tokens: TokenTable | None) -> None:
    """Add the inspector's routes to ``server`` (its HTTP transports serve them)."""

    def guarded(path: str, methods: list[str]) -> Callable[[Handler], Handler]:
        """A JSON route of the API: the caller's tenant from its token, refusals as JSON, changes same-site."""

        def decorate(handler: Handler) -> Handler:
            async def route(request: Request) -> Response:
                try:
                    if tokens is None and not _host_is_loopback(request):
                        raise RefusalError(421, "misdirected", "host: this server without tokens answers loopback only")
                    access = caller(request, tokens)
                    if access is None:
                        raise RefusalError(401, "invalid_token", "authorization: a valid bearer token is required")
                    if request.method != "GET" and not _same_origin(request):
                        raise RefusalError(403, "cross_site", "origin: changes are accepted from this page only")
                    return await handler(request, access)
                except RefusalError as refusal:
                    return _refusal(refusal)
                except MemoryRequestError as error:
                    return _refusal(RefusalError(400, "bad_request", str(error)))

            server.custom_route(f"{PREFIX}/api{path}", methods=methods, include_in_schema=False)(route)
            return handler

        return decorate

    def in_thread(fn: Callable[[], Any]) -> Awaitable[Any]:
        return anyio.to_thread.run_sync(fn)

    @guarded("/session", ["GET"])
    async def session(request: Request, access: Access) -> Response:
        """Who the caller is: the namespaces it may see, and the constants a recall uses."""
        return _json(await in_thread(lambda: session_of(service, access, tokens is not None)))

    @guarded("/stats", ["GET"])
    async def stats(request: Request, access: Access) -> Response:
        query = StatsQuery(request.query_params.get("namespace") or None)
        return _json(await in_thread(lambda: service.stats(query, access=access)))

    @guarded("/memories", ["GET"])
    async def memories(request: Request, access: Access) -> Response:
        query: ListQuery = _typed(ListQuery, dict(request.query_params), strings=True)
        return _json(await in_thread(lambda: service.list_memories(query, access=access)))

    @guarded("/memories/{memory_id}", ["GET", "PATCH", "DELETE"])
    async def memory(request: Request, access: Access) -> Response:
        memory_id = request.path_params["memory_id"]
        if request.method == "GET":
            return _json(await in_thread(lambda: service.get(memory_id, access=access)))
        if service.settings.serving.read_only:
            raise RefusalError(
                403, "read_only", "this server is read-only (tool_profile: read_only): nothing can change"
            )
        if request.method == "DELETE":
            await _body(request, Forget)
            return _json(await in_thread(lambda: service.forget(ForgetRequest(memory_id), access=access)))
        edit: MemoryEdit = await _body(request, MemoryEdit, memory_id=memory_id)
        return _json(await in_thread(lambda: service.update_memory(edit, access=access, source="operator")))

    @guarded("/preview", ["POST"])
    async def recall_preview(request: Request, access: Access) -> Response:
        ask: RecallQuery = await _body(request, RecallQuery)
        return _json(await in_thread(lambda: preview(service, ask, access=access)))

    @guarded("/curves", ["GET"])
    async def learning_curves(request: Request, access: Access) -> Response:
        """Curves of the configured run folders (every caller sees the same: they hold no tenant's memories)."""
        wanted = set(request.query_params.getlist("run"))
        return _json(await in_thread(lambda: curves(run_folders(list(service.settings.serving.ui_runs)), wanted)))

    def asset(name: str, media_type: str) -> Callable[[Request], Awaitable[Response]]:
        content = resources.files("memrl_mcp.transports").joinpath("ui", name).read_bytes()

        async def serve(request: Request) -> Response:
            if tokens is None and not _host_is_loopback(request):
                return _refusal(
                    RefusalError(421, "misdirected", "host: this server without tokens answers loopback only")
                )
            return Response(content, media_type=media_type, headers=SECURITY_HEADERS)

        return serve

    page = asset("index.html", "text/html; charset=utf-8")
    server.custom_route(PREFIX, methods=["GET"], include_in_schema=False)(page)
    server.custom_route(f"{PREFIX}/", methods=["GET"], include_in_schema=False)(page)
    for name, media_type in ASSETS.items():
        server.custom_route(f"{PREFIX}/{name}", methods=["GET"], include_in_schema=False)(asset(name, media_type))
