"""The inspector: a page at ``/ui`` on the HTTP server itself, to see what the memory learned and correct it.

The page (``memrl_mcp/ui/``: one HTML file, one script, one style sheet, no framework, nothing fetched from
elsewhere) talks to a small JSON API under ``/ui/api/``. The API is a thin adapter over the public
:class:`~memrl_mcp.memory.MemoryService` methods, under the same rules as every other route:

- **Tenants.** A request carries its bearer token in an ``Authorization`` header (the page keeps it in
  ``sessionStorage`` at most, never in a cookie), and sees only its token's namespaces. A server without tokens
  is a loopback-only server (``serving.tokens_for`` refuses any other bind); there the page needs no token, and a
  request must name a loopback host, so a DNS-rebound page cannot read it.
- **No cross-site writes.** A change is a ``PATCH`` or ``DELETE`` with a JSON body: a form cannot send either,
  and another site's script can only after a CORS preflight that this server never grants. On top, a change
  whose ``Origin`` or ``Sec-Fetch-Site`` says another site sent it is refused.
- **Untrusted text.** Tasks, experiences and metadata come from agents and LLMs. The script renders them with
  ``textContent`` only, and every answer carries a Content-Security-Policy without inline script, so even
  a missed spot could not run one.

"Why this memory?" (:func:`preview`) runs Phase A and B through the read-only search path and explains each
candidate with :mod:`memrl_mcp.algorithm`'s own numbers; nothing is logged as a recall. Learning curves are
read from harness run folders (the ``ui_runs`` setting) with the report's own loaders and drawn by the page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import numpy as np
from mcp.server import MCPServer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from memrl_mcp import algorithm
from memrl_mcp.access import Access
from memrl_mcp.auth import TokenTable, caller, is_loopback
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import MemoryService
from memrl_mcp.models import EffectiveSettings, MemoryDetail, Outcome, SortKey
from memrl_mcp.validation import MAX_METADATA_DEPTH, K

PREFIX = "/ui"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
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


class Refusal(Exception):
    """An HTTP refusal: status, a short code and a message that names the field."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


# -- why this memory? ------------------------------------------------------------------------------


class PreviewRequest(BaseModel):
    """What a recall would be asked; ``None`` is the server's setting."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: str
    namespace: str | None = None
    k1: int | None = None
    k2: int | None = None
    q_weight: float | None = None
    delta: float | None = None


class PreviewCandidate(BaseModel):
    """One memory of the Phase-A pool with every number Phase B chose by."""

    id: str
    task: str
    outcome: Outcome
    q: float
    visits: int
    similarity: float
    similarity_rank: int = Field(description="1 = most similar (Phase A's order).")
    z_similarity: float
    z_q: float
    score: float = Field(description="(1 - lambda) z_similarity + lambda z_q.")
    score_rank: int
    chosen: bool
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


def preview(service: MemoryService, ask: PreviewRequest, *, access: Access) -> Preview:
    """Phase A and B for ``ask`` through the read-only search, explained.

    The search is asked for every candidate (k2 = k1), which is Phase A's whole pool scored by Phase B, and
    never explores (exploration needs a pool larger than k2). The choice for the real k2 is then
    :func:`algorithm.select`'s without exploration, the z-scores those of :mod:`algorithm`."""
    s = service.settings
    k1 = K.check("k1", s.k1 if ask.k1 is None else ask.k1)
    k2 = K.check("k2", s.k2 if ask.k2 is None else ask.k2)
    q_weight = s.q_weight if ask.q_weight is None else ask.q_weight
    delta = service.delta if ask.delta is None else ask.delta
    if k2 > k1:
        raise MemoryRequestError(f"k2: {k2} exceeds k1 ({k1}): Phase B picks among Phase A's candidates")
    found = service.search(ask.task, ask.namespace, k1, k1, q_weight, delta, access=access)
    hits = sorted(found.memories, key=lambda m: -m.similarity)  # Phase A's order
    pool = [algorithm.Candidate(m.similarity, m.q) for m in hits]
    similarities = np.array([c.similarity for c in pool], dtype=np.float64)
    z_sim = algorithm.z_similarity(similarities, service.scale)
    z_q = algorithm.z_scores(np.array([c.q for c in pool], dtype=np.float64))
    chosen, scores, _ = algorithm.select(pool, k2, q_weight, service.scale)
    by_score = sorted(range(len(pool)), key=lambda i: (-scores[i], -pool[i].similarity, i))
    score_rank = {i: rank for rank, i in enumerate(by_score, 1)}
    candidates = [
        PreviewCandidate(
            id=m.id,
            task=m.task,
            outcome=m.outcome,
            q=m.q,
            visits=m.visits,
            similarity=m.similarity,
            similarity_rank=i + 1,
            z_similarity=float(z_sim[i]),
            z_q=float(z_q[i]),
            score=float(scores[i]),
            score_rank=score_rank[i],
            chosen=i in chosen,
            reason=_reason(i in chosen, score_rank[i], i + 1, k2),
        )
        for i, m in enumerate(hits)
    ]
    return Preview(
        namespace=found.namespace,
        k1=k1,
        k2=k2,
        q_weight=q_weight,
        delta=delta,
        sim_normalization=service.scale.mode,
        sim_mean=service.scale.mean,
        sim_std=service.scale.std,
        epsilon=s.epsilon,
        candidates=candidates,
    )


# -- learning curves -------------------------------------------------------------------------------


class CurvePoint(BaseModel):
    epoch: int
    value: float
    std: float | None = Field(None, description="Over seeds, when the curve is a mean of several.")
    partial: bool = Field(False, description="An unfinished epoch: the share of the tasks done so far.")


class Curve(BaseModel):
    """One setting (runs that differ only in their seed) of one benchmark, as the report draws it."""

    label: str
    seeds: int
    success_rate: list[CurvePoint]
    csr: list[CurvePoint]


class BenchmarkCurves(BaseModel):
    benchmark: str
    curves: list[Curve]


class Curves(BaseModel):
    available: list[str] = Field(description="Every configured run folder (folder names).")
    runs: list[str] = Field(description="The run folders drawn.")
    benchmarks: list[BenchmarkCurves]
    problems: list[str] = Field(description="Run folders that could not be read, and why.")


def run_folders(roots: list[Path]) -> list[Path]:
    """The run folders under the configured paths: a folder with a ``run.json``, or the ones directly in it."""
    folders: list[Path] = []
    for root in roots:
        if (root / "run.json").is_file():
            folders.append(root)
        elif root.is_dir():
            folders += sorted(child for child in root.iterdir() if (child / "run.json").is_file())
    return folders


def curves(folders: list[Path], wanted: set[str]) -> Curves:
    """Success per epoch and CSR per setting of the ``wanted`` folders (all when empty), grouped by benchmark,
    with the report's own loading and grouping (a setting of several seeds is their mean with its standard
    deviation, over the seeds that finished the epoch)."""
    from memrl_harness.report import load_run, settings_of  # the harness's loaders: only when curves are asked

    runs, problems = [], []
    for folder in folders:
        if wanted and folder.name not in wanted:
            continue
        try:
            runs.append(load_run(folder))
        except (OSError, ValueError) as error:  # ValueError: pydantic's, for a damaged run.json or episode
            problems.append(f"{folder.name}: {type(error).__name__}: {str(error).splitlines()[0]}")
    by_benchmark: dict[str, list[Curve]] = {}
    for setting in settings_of(runs) if runs else []:
        if len(setting.runs) > 1:
            epochs = setting.aggregate.epochs
            success = [CurvePoint(epoch=e.epoch, value=e.success_rate.mean, std=e.success_rate.std) for e in epochs]
            csr = [CurvePoint(epoch=e.epoch, value=e.csr.mean, std=e.csr.std) for e in epochs]
        else:
            epochs_of_run = setting.runs[0].summary.epochs
            success = [CurvePoint(epoch=e.epoch, value=e.success_rate, partial=e.partial) for e in epochs_of_run]
            csr = [CurvePoint(epoch=e.epoch, value=e.csr, partial=e.partial) for e in epochs_of_run]
        curve = Curve(label=setting.label, seeds=len(setting.runs), success_rate=success, csr=csr)
        by_benchmark.setdefault(setting.config.benchmark, []).append(curve)
    return Curves(
        available=[folder.name for folder in folders],
        runs=[run.path.name for run in runs],
        benchmarks=[BenchmarkCurves(benchmark=name, curves=group) for name, group in by_benchmark.items()],
        problems=problems,
    )


# -- the session ----------------------------------------------------------------------------------


class Session(BaseModel):
    """What the page needs to know about its caller and the server."""

    namespaces: list[str] = Field(description="The namespaces the caller may see that exist (or are its token's).")
    default_namespace: str
    every_namespace: bool = Field(description="The caller may use any namespace (a local caller, or a '*' token).")
    tokens: bool = Field(description="The server requires bearer tokens.")
    read_only: bool
    settings: EffectiveSettings
    q_history_size: int = Field(description="Changes of Q each memory keeps.")
    run_folders: int


def session_of(service: MemoryService, access: Access, tokens: bool) -> Session:
    """A token's own namespaces; for a caller who may use every namespace, the ones holding memories (one pass
    over the store: the page asks once per visit)."""
    if access.namespaces is not None:
        names = set(access.namespaces)
    else:
        names = {memory.namespace for memory in service.memories()}
    default = access.default or service.settings.namespace
    return Session(
        namespaces=sorted(names | {default}),
        default_namespace=default,
        every_namespace=access.namespaces is None,
        tokens=tokens,
        read_only=service.settings.read_only,
        settings=service.effective_settings(),
        q_history_size=service.settings.q_history_size,
        run_folders=len(run_folders(list(service.settings.ui_runs))),
    )


# -- the routes -----------------------------------------------------------------------------------


class MemoryEdit(BaseModel):
    """A correction of one memory (the page's edit form)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    experience: str | None = None
    metadata: dict[str, Any] | None = None
    reset_q: bool = False


class Forget(BaseModel):
    """A forget's body: an empty JSON object (a body that no form or simple request can send)."""

    model_config = ConfigDict(extra="forbid")


class ListQuery(BaseModel):
    """The memory table's query string, as typed values (a bad one is named in the refusal)."""

    model_config = ConfigDict(extra="forbid")

    namespace: str | None = None
    outcome: Outcome | None = None
    q_min: float | None = None
    q_max: float | None = None
    text: str | None = None
    sort: SortKey = "updated_at"
    descending: bool = True
    limit: int | None = None
    cursor: str | None = None


def _typed(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise Refusal(400, "bad_request", f"{field}: {first['msg']}") from None


def _json(model: BaseModel | dict[str, Any], status: int = 200) -> Response:
    body = model.model_dump_json() if isinstance(model, BaseModel) else json.dumps(model)
    return Response(body, status_code=status, media_type="application/json", headers=SECURITY_HEADERS)


def _refusal(refusal: Refusal) -> Response:
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


async def _body(request: Request, model: type[BaseModel]) -> Any:
    """The request's JSON body as ``model``, or a refusal naming what is wrong: never more than
    :data:`MAX_BODY_BYTES` read into memory, and never a body the JSON parser could not survive. Parsed in a worker
    thread, so that the event loop (every other client's requests) does not wait: the costliest 1 MB body measured,
    a list of 330,000 empty lists, takes 0.16-0.25 s to scan and 0.11 s to parse."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise Refusal(415, "unsupported_media_type", "content-type: a change is sent as application/json")
    raw = bytearray()
    async for chunk in request.stream():  # counted as it arrives: a body without Content-Length is bounded too
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise Refusal(413, "too_large", f"body: at most {MAX_BODY_BYTES} bytes")
    return await anyio.to_thread.run_sync(_parsed, bytes(raw), model)


def _parsed(raw: bytes, model: type[BaseModel]) -> Any:
    deep = _too_deep(raw, model)
    if deep is not None:
        raise Refusal(400, "bad_request", deep)
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as error:
        raise Refusal(400, "bad_request", f"body: not UTF-8 ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise Refusal(400, "bad_request", f"body: not JSON ({error.msg} at character {error.pos})") from None
    except ValueError as error:  # an integer of more digits than Python converts (4300)
        raise Refusal(400, "bad_request", f"body: not JSON ({str(error).split(':')[0]})") from None
    return _typed(model, data)


JSON_TOKENS = re.compile(rb'"(?:[^"\\]+|\\.?)*(?:"|\Z)|[][{}]', re.DOTALL)
"""A JSON string (to its closing quote, or to the end of an unterminated one) or a bracket. Linear: the string's
loop stops only at a quote or the end, where its tail always matches, so the engine never backtracks."""
MAX_BODY_DEPTH = 1 + MAX_METADATA_DEPTH
"""The deepest body any API request has: an object holding metadata, itself at most MAX_METADATA_DEPTH deep."""


def _too_deep(raw: bytes, model: type[BaseModel]) -> str | None:
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
                if field in model.model_fields:
                    return f"{field}: JSON nested deeper than {MAX_BODY_DEPTH - 1} levels"
                return f"body: JSON nested deeper than {MAX_BODY_DEPTH} levels"
        else:
            depth -= 1
    return None


def mount(server: MCPServer, service: MemoryService, tokens: TokenTable | None) -> None:
    """Add the inspector's routes to ``server`` (its HTTP transports serve them)."""

    def guarded(path: str, methods: list[str]) -> Callable[[Handler], Handler]:
        """A JSON route of the API: the caller's tenant from its token, refusals as JSON, changes same-site."""

        def decorate(handler: Handler) -> Handler:
            async def route(request: Request) -> Response:
                try:
                    if tokens is None and not _host_is_loopback(request):
                        raise Refusal(421, "misdirected", "host: this server without tokens answers loopback only")
                    access = caller(request, tokens)
                    if access is None:
                        raise Refusal(401, "invalid_token", "authorization: a valid bearer token is required")
                    if request.method != "GET" and not _same_origin(request):
                        raise Refusal(403, "cross_site", "origin: changes are accepted from this page only")
                    return await handler(request, access)
                except Refusal as refusal:
                    return _refusal(refusal)
                except MemoryRequestError as error:
                    return _refusal(Refusal(400, "bad_request", str(error)))

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
        namespace = request.query_params.get("namespace") or None
        return _json(await in_thread(lambda: service.stats(namespace, access=access)))

    @guarded("/memories", ["GET"])
    async def memories(request: Request, access: Access) -> Response:
        query: ListQuery = _typed(ListQuery, dict(request.query_params))
        arguments = query.model_dump()
        return _json(await in_thread(lambda: service.list_memories(**arguments, access=access)))

    @guarded("/memories/{memory_id}", ["GET", "PATCH", "DELETE"])
    async def memory(request: Request, access: Access) -> Response:
        memory_id = request.path_params["memory_id"]
        if request.method == "GET":
            return _json(await in_thread(lambda: service.get(memory_id, access=access)))
        if service.settings.read_only:
            raise Refusal(403, "read_only", "this server is read-only (read_only: true)")
        if request.method == "DELETE":
            await _body(request, Forget)
            return _json(await in_thread(lambda: service.forget(memory_id, access=access)))
        edit: MemoryEdit = await _body(request, MemoryEdit)
        updated: MemoryDetail = await in_thread(
            lambda: service.update_memory(
                memory_id, experience=edit.experience, metadata=edit.metadata, reset_q=edit.reset_q, access=access
            )
        )
        return _json(updated)

    @guarded("/preview", ["POST"])
    async def recall_preview(request: Request, access: Access) -> Response:
        ask: PreviewRequest = await _body(request, PreviewRequest)
        return _json(await in_thread(lambda: preview(service, ask, access=access)))

    @guarded("/curves", ["GET"])
    async def learning_curves(request: Request, access: Access) -> Response:
        """Curves of the configured run folders (every caller sees the same: they hold no tenant's memories)."""
        wanted = set(request.query_params.getlist("run"))
        return _json(await in_thread(lambda: curves(run_folders(list(service.settings.ui_runs)), wanted)))

    def asset(name: str, media_type: str) -> Callable[[Request], Awaitable[Response]]:
        content = resources.files("memrl_mcp").joinpath("ui", name).read_bytes()

        async def serve(request: Request) -> Response:
            if tokens is None and not _host_is_loopback(request):
                return _refusal(Refusal(421, "misdirected", "host: this server without tokens answers loopback only"))
            return Response(content, media_type=media_type, headers=SECURITY_HEADERS)

        return serve

    page = asset("index.html", "text/html; charset=utf-8")
    server.custom_route(PREFIX, methods=["GET"], include_in_schema=False)(page)
    server.custom_route(f"{PREFIX}/", methods=["GET"], include_in_schema=False)(page)
    for name, media_type in ASSETS.items():
        server.custom_route(f"{PREFIX}/{name}", methods=["GET"], include_in_schema=False)(asset(name, media_type))
