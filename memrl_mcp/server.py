"""The MCP face of the memory: tools, resources and a prompt over one :class:`MemoryService`, plus the
HTTP routes operators use: ``/health``, ``/metrics`` (Prometheus) and ``/stats``.

With a :class:`~memrl_mcp.auth.TokenTable`, the HTTP transports require a bearer token, and every tool,
resource and ``/stats`` sees only the namespaces of the caller's token."""

import functools
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memrl_mcp.auth import TokenTable, access_of
from memrl_mcp.memory import Access, MemoryRequestError, MemoryService
from memrl_mcp.models import ForgetResult, Outcome, RecallResult, ReportResult, Stats, StoreResult
from memrl_mcp.observability import Metrics

P = ParamSpec("P")
R = TypeVar("R")

INSTRUCTIONS = """\
An episodic memory that learns which past experiences actually help (MemRL).
Loop for every task: recall_experience(task) -> act, following the successful memories and avoiding
the mistakes of the failed ones -> report_outcome(recall_id, reward, experience) with the reward and a
short experience of this attempt (on success: 3-5 high-level steps that worked; on failure: what went
wrong and what to avoid). Rewards teach the memory which experiences to hand out next time."""

Namespace = Annotated[
    str | None, Field(description="Memory namespace (one per project or agent); default: the server's.")
]
Metadata = Annotated[
    dict[str, Any] | None, Field(description="Free JSON object kept with the memory (benchmark, task id...).")
]


def _client() -> str | None:
    token = get_access_token()
    return None if token is None else token.client_id


def _instrumented(metrics: Metrics) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Time, count and log each call; refused requests reach the client as tool errors with their message
    (which names the field)."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with metrics.call(fn.__name__, _client()) as outcome:
                try:
                    return fn(*args, **kwargs)
                except MemoryRequestError as error:
                    outcome["status"] = "refused"
                    raise ToolError(str(error)) from None

        return wrapper

    return decorate


def create_server(service: MemoryService, tokens: TokenTable | None = None) -> MCPServer:
    """An MCP server exposing ``service``; with ``tokens``, its HTTP transports require one. The caller owns
    the service and closes it."""
    auth = None
    if tokens is not None:
        # Static bearer tokens: no OAuth authorization server and no metadata routes, only verification.
        auth = AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None)
    server = MCPServer(name="memrl-mcp", instructions=INSTRUCTIONS, version="0.1.0", token_verifier=tokens, auth=auth)
    limits = service.settings
    metrics = Metrics(service)
    instrumented = _instrumented(metrics)

    def access() -> Access:
        return access_of(get_access_token())

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    @instrumented
    def recall_experience(
        task: Annotated[
            str, Field(description=f"The task at hand, in plain words (max {limits.max_task_chars} characters).")
        ],
        namespace: Namespace = None,
        k1: Annotated[int | None, Field(description="Phase A: candidates by similarity (default: server's).")] = None,
        k2: Annotated[int | None, Field(description="Phase B: memories returned, <= k1 (default: server's).")] = None,
        q_weight: Annotated[
            float | None, Field(description="lambda in [0, 1]: 0 = similarity only (RAG), 1 = utility only.")
        ] = None,
        delta: Annotated[float | None, Field(description="Minimum cosine similarity for Phase A.")] = None,
    ) -> RecallResult:
        """Recall the past experiences most likely to help with this task.

        Phase A takes the k1 memories whose task is most similar (similarity >= delta); Phase B
        re-ranks them by (1 - lambda) z(similarity) + lambda z(learned utility Q) and returns the top k2.
        Successful memories are examples to follow; failed ones are mistakes to avoid. No memory is a
        valid answer. Always report the episode's reward with the returned recall_id."""
        return service.recall(task, namespace, k1, k2, q_weight, delta, access=access())

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    @instrumented
    def report_outcome(
        recall_id: Annotated[str, Field(description="The recall_id that recall_experience returned.")],
        reward: Annotated[
            float,
            Field(description=f"Episode reward in [{limits.reward_min:g}, {limits.reward_max:g}] (success high)."),
        ],
        experience: Annotated[
            str | None,
            Field(
                description="What to remember from this episode: on success a short procedure (3-5 steps), "
                f"on failure a reflection on what to avoid (max {limits.max_experience_chars} characters)."
            ),
        ] = None,
        outcome: Annotated[
            Outcome | None, Field(description="success or failure; default: success when reward > 0.")
        ] = None,
        metadata: Metadata = None,
    ) -> ReportResult:
        """Report how the episode went: moves the utility Q of exactly the memories that recall returned
        toward the reward (Q <- Q + alpha (R - Q)), and stores the new experience keyed by the recalled task.
        Each recall is reported once."""
        return service.report(recall_id, reward, experience, outcome, metadata, access=access())

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        )
    )
    @instrumented
    def store_experience(
        task: Annotated[str, Field(description=f"The task the experience is about (max {limits.max_task_chars}).")],
        experience: Annotated[
            str, Field(description=f"What to reuse or avoid (max {limits.max_experience_chars} characters).")
        ],
        namespace: Namespace = None,
        outcome: Annotated[Outcome, Field(description="success (to follow) or failure (to avoid).")] = "success",
        q: Annotated[float | None, Field(description="Initial utility; default: the server's Q_init.")] = None,
        metadata: Metadata = None,
    ) -> StoreResult:
        """Add a memory directly (seeding, imports). A near-duplicate task with the same outcome in the
        same namespace does not create a twin: the existing memory takes the new experience and keeps
        its learned Q."""
        return service.store_experience(task, experience, namespace, outcome, q, metadata, access=access())

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        )
    )
    @instrumented
    def forget_experience(
        memory_id: Annotated[str | None, Field(description="Delete this one memory.")] = None,
        namespace: Annotated[str | None, Field(description="Delete every memory and recall of this namespace.")] = None,
    ) -> ForgetResult:
        """Delete one memory by id, or all of a namespace. Give exactly one of the two."""
        return service.forget(memory_id, namespace, access=access())

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    @instrumented
    def memory_stats(
        namespace: Annotated[str | None, Field(description="One namespace; default: all.")] = None,
    ) -> Stats:
        """Counts, the distribution of learned utility Q, and recalls pending and reported."""
        return service.stats(namespace, access=access())

    @server.resource(
        "memrl://stats", mime_type="application/json", description="Statistics of every namespace you may use."
    )
    def all_stats() -> str:
        return service.stats(access=access()).model_dump_json()

    @server.resource(
        "memrl://stats/{namespace}", mime_type="application/json", description="Statistics of one namespace."
    )
    def namespace_stats(namespace: str) -> str:
        try:
            return service.stats(namespace, access=access()).model_dump_json()
        except MemoryRequestError as error:
            raise ResourceError(str(error)) from None

    @server.resource("memrl://memories/{memory_id}", mime_type="application/json", description="One memory.")
    def memory(memory_id: str) -> str:
        try:
            return service.get(memory_id, access=access()).model_dump_json()
        except MemoryRequestError as error:
            raise ResourceError(str(error)) from None

    @server.prompt(title="Learn from experience", description="Teaches the recall -> act -> report loop.")
    def memory_loop(task: str) -> str:
        return (
            f"{INSTRUCTIONS}\n\nTask: {task}\n\n"
            "1. Call recall_experience with this task. Keep the recall_id.\n"
            "2. Read the memories: follow the procedures of successes; avoid what the failures warn about.\n"
            "3. Do the task.\n"
            "4. Call report_outcome with the recall_id, a reward (1 for success, -1 or 0 for failure), and "
            "an experience: on success 3-5 steps that worked, on failure what went wrong and what to avoid."
        )

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> Response:
        """Liveness for load balancers and service managers: no token needed, nothing private."""
        return JSONResponse({"status": "ok"})

    @server.custom_route("/metrics", methods=["GET"])
    async def prometheus(request: Request) -> Response:
        """Prometheus text format: tool calls, latency, memories, write conflicts (no tenant data). With tokens,
        a scraper needs one too: the totals span every tenant."""
        if tokens is not None and get_access_token() is None:
            return JSONResponse({"error": "invalid_token", "error_description": "a bearer token is required"}, 401)
        text = await anyio.to_thread.run_sync(metrics.exposition)  # counts memories: a store call
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @server.custom_route("/stats", methods=["GET"])
    async def http_stats(request: Request) -> Response:
        """memory_stats over plain HTTP (``?namespace=``), for dashboards; scoped by the bearer token."""
        token = get_access_token()
        if tokens is not None and token is None:
            return JSONResponse({"error": "invalid_token", "error_description": "a bearer token is required"}, 401)
        try:
            namespace, caller = request.query_params.get("namespace"), access_of(token)
            stats = await anyio.to_thread.run_sync(lambda: service.stats(namespace, access=caller))
        except MemoryRequestError as error:
            return JSONResponse({"error": "bad_request", "error_description": str(error)}, 400)
        return Response(stats.model_dump_json(), media_type="application/json")

    return server
