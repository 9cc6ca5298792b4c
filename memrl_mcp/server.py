"""The MCP face of the memory: tools, resources and a prompt over one :class:`MemoryService`, plus the
HTTP routes operators use: ``/health``, ``/metrics`` (Prometheus) and ``/stats``.

With a :class:`~memrl_mcp.auth.TokenTable`, the HTTP transports require a bearer token, and every tool,
resource and ``/stats`` sees only the namespaces of the caller's token. A call that names no namespace uses the
token's first one, else one derived from the client's project root (:mod:`memrl_mcp.roots`), else the
``namespace`` setting."""

import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memrl_mcp import __version__, inspector
from memrl_mcp.access import Access
from memrl_mcp.auth import TokenTable, caller
from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.memory import MemoryService
from memrl_mcp.models import (
    ForgetResult,
    MemoryDetail,
    MemoryPage,
    Outcome,
    RecallResult,
    ReportResult,
    SearchResult,
    SortKey,
    Stats,
    StepAdviceResult,
    StoreResult,
    TrajectoryResult,
)
from memrl_mcp.observability import Metrics
from memrl_mcp.roots import roots_namespace
from memrl_mcp.validation import (
    MAX_EPISODE_ID_CHARS,
    MAX_METADATA_DEPTH,
    MAX_METADATA_KEY_CHARS,
    CandidateCount,
    NamespaceName,
    QWeight,
    Similarity,
    TextQuery,
)

R = TypeVar("R")

INSTRUCTIONS = """\
An episodic memory that learns which past experiences actually help (MemRL).
Loop for every task: recall_experience(task) -> act, following the successful memories and avoiding
the mistakes of the failed ones -> report_outcome(recall_id, reward, experience) with the reward and a
short experience of this attempt (on success: 3-5 high-level steps that worked; on failure: what went
wrong and what to avoid). Rewards teach the memory which experiences to hand out next time.
For multi-step tasks (a game, a shell session, a database session), also ask recall_step_advice(task,
observation) at each step for encouraged and discouraged actions, and at the end report_trajectory(task, steps,
episode_id) with every (observation, action, reward): it learns which step helped and which went wrong."""

Namespace = Annotated[
    NamespaceName | None, Field(description="Memory namespace (one per project or agent); default: the server's.")
]
K1 = Annotated[CandidateCount | None, Field(description="Phase A: candidates by similarity (default: server's).")]
K2 = Annotated[CandidateCount | None, Field(description="Phase B: memories returned, <= k1 (default: server's).")]
Lambda = Annotated[QWeight | None, Field(description="lambda: 0 = similarity only (RAG), 1 = utility only.")]
Delta = Annotated[Similarity | None, Field(description="Minimum cosine similarity for Phase A.")]
STRICT = ConfigDict(strict=True, extra="forbid")


TOKEN_REQUIRED = "authorization: a valid bearer token is required"


def _served(
    fn: Callable[..., R], identify: Callable[[Context[Any, Any]], Awaitable[Access]], metrics: Metrics
) -> Callable[..., Awaitable[R]]:
    """The tool body ``fn``, which takes its caller as ``access``, as the SDK serves it: the SDK hands the call's
    ``Context`` (``ctx``) in place of ``access``, and ``identify`` turns it into the caller's :class:`Access`.
    Every tool is served through here, so none can forget its caller's tenant or project namespace, and none
    reads the caller from anywhere but the request that carried the call. The body runs in a worker thread (the
    store's calls block); each call is timed, counted and logged; a refused request reaches the client as a
    tool error with its message (which names the field)."""
    signature = inspect.signature(fn)
    if "access" not in signature.parameters:
        raise TypeError(f"the tool {fn.__name__} must take its caller's access")
    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context[Any, Any])
    parameters = [*(p for p in signature.parameters.values() if p.name != "access"), context]

    @functools.wraps(fn)
    async def served(*args: Any, ctx: Context[Any, Any], **kwargs: Any) -> R:
        with metrics.call(fn.__name__) as call:
            try:
                access = await identify(ctx)
                call.client = access.client
                return await anyio.to_thread.run_sync(functools.partial(fn, *args, access=access, **kwargs))
            except MemrlError as error:
                call.status = "refused"
                raise ToolError(str(error)) from None

    served.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    served.__annotations__ = {
        **{name: kind for name, kind in fn.__annotations__.items() if name != "access"},
        "ctx": Context[Any, Any],
    }
    return served


def strict_tool(fn: Callable[..., object], annotations: ToolAnnotations) -> Tool:
    """A tool whose arguments are checked strictly: the SDK builds its argument model from the signature in
    pydantic's lax mode ("0.5" passes as a number, true as an integer) and ignores unknown arguments, so a
    client's typo would go unnoticed. The same model in strict mode and closed to extra arguments replaces it,
    and the input schema says so (``additionalProperties: false``)."""
    tool = Tool.from_function(fn, annotations=annotations)
    lax = tool.fn_metadata.arg_model
    strict = type(lax.__name__, (lax,), {"model_config": STRICT, "__module__": __name__})
    metadata = tool.fn_metadata.model_copy(update={"arg_model": strict})
    return tool.model_copy(update={"fn_metadata": metadata, "parameters": strict.model_json_schema(by_alias=True)})


def create_server(service: MemoryService, tokens: TokenTable | None = None) -> MCPServer:
    """An MCP server exposing ``service``; with ``tokens``, its HTTP transports require one. The caller owns
    the service and closes it."""
    limits, rules = service.settings, service.limits
    metrics = Metrics(service)
    Task = Annotated[
        rules.task.type,
        Field(description=f"The task at hand, in plain words (max {limits.max_task_chars} characters)."),
    ]
    Metadata = Annotated[
        rules.metadata.type | None,
        Field(
            description="Free JSON object kept with the memory (benchmark, task id...): at most "
            f"{limits.max_metadata_chars} characters as JSON, {MAX_METADATA_DEPTH} levels deep, keys of at most "
            f"{MAX_METADATA_KEY_CHARS} characters, finite numbers, integers within +-2^53."
        ),
    ]

    from_roots = limits.namespace_from_roots and "namespace" not in limits.model_fields_set

    async def identify(ctx: Context[Any, Any]) -> Access:
        """A tool's caller: the token of the request that carried the call, and, when neither that token nor
        the settings name a default namespace, the one of the client's project root."""
        access = caller(ctx.request_context.request, tokens)
        if access is None:  # over HTTP the SDK answered 401 already; this is a call without HTTP, or a bug
            raise MemoryRequestError(TOKEN_REQUIRED)
        if access.default is not None or not from_roots:
            return access
        project = await roots_namespace(ctx)
        return access if project is None else dataclasses.replace(access, default=project)

    def reader(ctx: Context[Any, Any]) -> Access:
        """A resource's caller: the token of the request that carried the read."""
        access = caller(ctx.request_context.request, tokens)
        if access is None:
            raise ResourceError(TOKEN_REQUIRED)
        return access

    def recall_experience(
        task: Task,
        namespace: Namespace = None,
        k1: K1 = None,
        k2: K2 = None,
        q_weight: Lambda = None,
        delta: Delta = None,
        *,
        access: Access,
    ) -> RecallResult:
        """Recall the past experiences most likely to help with this task.

        Phase A takes the k1 memories whose task is most similar (similarity >= delta); Phase B
        re-ranks them by (1 - lambda) z(similarity) + lambda z(learned utility Q) and returns the top k2.
        Successful memories are examples to follow; failed ones are mistakes to avoid. No memory is a
        valid answer. Always report the episode's reward with the returned recall_id."""
        return service.recall(task, namespace, k1, k2, q_weight, delta, access=access)

    def search_experience(
        task: Task,
        namespace: Namespace = None,
        k1: K1 = None,
        k2: K2 = None,
        q_weight: Lambda = None,
        delta: Delta = None,
        *,
        access: Access,
    ) -> SearchResult:
        """Look memories up like recall_experience, without a recall: nothing is logged and there is nothing to
        report, so no utility Q will learn from this use. For browsing, or a retrieval-only baseline; an agent
        that will learn the outcome should call recall_experience instead."""
        return service.search(task, namespace, k1, k2, q_weight, delta, access=access)

    def report_outcome(
        recall_id: Annotated[str, Field(description="The recall_id that recall_experience returned.")],
        reward: Annotated[
            rules.reward.type,
            Field(description=f"Episode reward in [{limits.reward_min:g}, {limits.reward_max:g}] (success high)."),
        ],
        experience: Annotated[
            rules.experience.type | None,
            Field(
                description="What to remember from this episode: on success a short procedure (3-5 steps), "
                f"on failure a reflection on what to avoid (max {limits.max_experience_chars} characters)."
            ),
        ] = None,
        outcome: Annotated[
            Outcome | None, Field(description="success or failure; default: success when reward > 0.")
        ] = None,
        metadata: Metadata = None,
        *,
        access: Access,
    ) -> ReportResult:
        """Report how the episode went: moves the utility Q of exactly the memories that recall returned
        toward the reward (Q <- Q + alpha (R - Q)), and stores the new experience keyed by the recalled task.
        Each recall is reported once."""
        return service.report(recall_id, reward, experience, outcome, metadata, access=access)

    def recall_step_advice(
        task: Task,
        observation: Annotated[
            rules.observation.type,
            Field(
                description="What the agent sees now (max "
                f"{limits.max_observation_chars} characters; the head and tail of a long one are matched)."
            ),
        ],
        namespace: Namespace = None,
        k: Annotated[
            CandidateCount | None, Field(description=f"Step records to match (default {limits.step_k}).")
        ] = None,
        *,
        access: Access,
    ) -> StepAdviceResult:
        """Action advice for the current step of a multi-step task, from steps remembered in similar situations
        (same kind of task, similar observation): encouraged actions (they led to reward) and discouraged ones
        (they did not). Read-only; call it at every step, and report the whole trajectory at the end with
        report_trajectory so that the advice improves."""
        return service.recall_step_advice(task, observation, namespace, k, access=access)

    def report_trajectory(
        task: Task,
        steps: Annotated[
            rules.steps.type,
            Field(
                description=f"Every step of the episode in order, at most {limits.max_trajectory_steps}: "
                "{observation, action, reward}; the last step's reward is the episode's final reward."
            ),
        ],
        episode_id: Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_EPISODE_ID_CHARS,
                description="Your unique id of this episode: a second report with the same id (a retry) changes "
                "nothing.",
            ),
        ],
        namespace: Namespace = None,
        recall_id: Annotated[
            str | None,
            Field(
                max_length=36,
                description="The recall_id of recall_experience for this episode, if any: its report_outcome is "
                "applied too, with the last step's reward.",
            ),
        ] = None,
        *,
        access: Access,
    ) -> TrajectoryResult:
        """Report a finished multi-step episode: each step's Q(task, observation, action) moves toward its n-step
        target (the discounted rewards that followed it, plus the value of where it led), so that later advice
        encourages the steps that led to success and discourages the ones that did not. Once per episode_id."""
        return service.report_trajectory(task, steps, episode_id, namespace, recall_id, access=access)

    def store_experience(
        task: Annotated[
            rules.task.type, Field(description=f"The task the experience is about (max {limits.max_task_chars}).")
        ],
        experience: Annotated[
            rules.experience.type,
            Field(description=f"What to reuse or avoid (max {limits.max_experience_chars} characters)."),
        ],
        namespace: Namespace = None,
        outcome: Annotated[Outcome, Field(description="success (to follow) or failure (to avoid).")] = "success",
        q: Annotated[
            rules.reward.type | None, Field(description="Initial utility; default: the server's Q_init.")
        ] = None,
        metadata: Metadata = None,
        *,
        access: Access,
    ) -> StoreResult:
        """Add a memory directly (seeding, imports). A near-duplicate task with the same outcome in the
        same namespace does not create a twin: the existing memory takes the new experience and keeps
        its learned Q."""
        return service.store_experience(task, experience, namespace, outcome, q, metadata, access=access)

    def forget_experience(
        memory_id: Annotated[str | None, Field(description="Delete this one memory.")] = None,
        namespace: Annotated[
            NamespaceName | None, Field(description="Delete every memory and recall of this namespace.")
        ] = None,
        *,
        access: Access,
    ) -> ForgetResult:
        """Delete one memory by id, or all of a namespace. Give exactly one of the two."""
        return service.forget(memory_id, namespace, access=access)

    def memory_stats(
        namespace: Annotated[NamespaceName | None, Field(description="One namespace; default: all.")] = None,
        *,
        access: Access,
    ) -> Stats:
        """Counts, the distribution of learned utility Q, and recalls pending and reported."""
        return service.stats(namespace, access=access)

    def list_memories(
        namespace: Namespace = None,
        outcome: Annotated[Outcome | None, Field(description="Only successes, or only failures.")] = None,
        q_min: Annotated[rules.reward.type | None, Field(description="Only memories with Q >= q_min.")] = None,
        q_max: Annotated[rules.reward.type | None, Field(description="Only memories with Q <= q_max.")] = None,
        text: Annotated[
            TextQuery | None,
            Field(description="Only memories whose task or experience holds every word of this text (any case)."),
        ] = None,
        sort: Annotated[SortKey, Field(description="q (learned utility), visits, or updated_at.")] = "updated_at",
        descending: Annotated[bool, Field(description="Highest first (default).")] = True,
        limit: Annotated[
            rules.page.type | None, Field(description=f"Memories per page (default 20, max {limits.max_list_page}).")
        ] = None,
        cursor: Annotated[
            str | None, Field(max_length=512, description="next_cursor of the previous page (same sort).")
        ] = None,
        *,
        access: Access,
    ) -> MemoryPage:
        """List what the memory holds, a page at a time: each memory's task, experience, outcome, learned
        utility Q, visits, last reward and merges. To read one memory's Q history, read the resource
        memrl://memories/{id}."""
        return service.list_memories(
            namespace, outcome, q_min, q_max, text, sort, descending, limit, cursor, access=access
        )

    def update_memory(
        memory_id: Annotated[str, Field(max_length=36, description="The memory to correct.")],
        experience: Annotated[
            rules.experience.type | None,
            Field(description=f"Its new experience text (max {limits.max_experience_chars} characters)."),
        ] = None,
        metadata: Metadata = None,
        reset_q: Annotated[
            bool,
            Field(
                description="Forget what was learned: Q back to Q_init and visits to 0 (kept in its history). "
                "Q and visits are otherwise learned from rewards, never set."
            ),
        ] = False,
        *,
        access: Access,
    ) -> MemoryDetail:
        """Correct a memory: replace its experience and/or its metadata (the same limits as store_experience).
        Its task, outcome, Q and visits stay, unless reset_q forgets what was learned."""
        return service.update_memory(memory_id, experience, metadata, reset_q, access=access)

    def tool(fn: Callable[..., object], annotations: ToolAnnotations) -> Tool:
        return strict_tool(_served(fn, identify, metrics), annotations)

    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    tools = [
        tool(recall_experience, writes),
        tool(search_experience, reads),
        tool(report_outcome, writes),
        tool(store_experience, writes.model_copy(update={"idempotent_hint": True})),
        tool(recall_step_advice, reads),
        tool(report_trajectory, writes.model_copy(update={"idempotent_hint": True})),
        tool(
            forget_experience,
            ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False),
        ),
        tool(memory_stats, reads),
        tool(list_memories, reads),
        tool(update_memory, writes.model_copy(update={"destructive_hint": True})),
    ]
    if limits.read_only:  # a frozen memory: the tools that would change it are not offered at all
        tools = [tool for tool in tools if tool.annotations is not None and tool.annotations.read_only_hint]
    auth = None
    if tokens is not None:
        # Static bearer tokens: no OAuth authorization server and no metadata routes, only verification.
        auth = AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None)
    server = MCPServer(
        name="memrl-mcp",
        instructions=INSTRUCTIONS,
        version=__version__,
        token_verifier=tokens,
        auth=auth,
        tools=tools,
    )

    def stats(ctx: Context[Any, Any], namespace: str | None = None) -> str:
        try:
            return service.stats(namespace, access=reader(ctx)).model_dump_json()
        except MemoryRequestError as error:
            raise ResourceError(str(error)) from None

    # Templates, both: only a template's function is handed the request (a static resource's is called bare).
    server.resource(
        "memrl://stats{?namespace}",
        name="all_stats",
        mime_type="application/json",
        description="Statistics of every namespace you may use.",
    )(stats)
    server.resource(
        "memrl://stats/{namespace}",
        name="namespace_stats",
        mime_type="application/json",
        description="Statistics of one namespace.",
    )(stats)

    @server.resource(
        "memrl://settings",
        mime_type="application/json",
        description="The constants this server retrieves and learns with (k1, k2, lambda, alpha, delta, ...).",
    )
    def effective_settings() -> str:
        return service.effective_settings().model_dump_json()

    @server.resource(
        "memrl://memories/{memory_id}",
        mime_type="application/json",
        description="One memory, with the history of its Q (each reward folded in, and resets).",
    )
    def memory(memory_id: str, ctx: Context[Any, Any]) -> str:
        try:
            return service.get(memory_id, access=reader(ctx)).model_dump_json()
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
        if caller(request, tokens) is None:
            return JSONResponse({"error": "invalid_token", "error_description": "a bearer token is required"}, 401)
        text = await anyio.to_thread.run_sync(metrics.exposition)  # counts memories: a store call
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @server.custom_route("/stats", methods=["GET"])
    async def http_stats(request: Request) -> Response:
        """memory_stats over plain HTTP (``?namespace=``), for dashboards; scoped by the bearer token."""
        access = caller(request, tokens)
        if access is None:
            return JSONResponse({"error": "invalid_token", "error_description": "a bearer token is required"}, 401)
        try:
            namespace = request.query_params.get("namespace")
            stats = await anyio.to_thread.run_sync(lambda: service.stats(namespace, access=access))
        except MemoryRequestError as error:
            return JSONResponse({"error": "bad_request", "error_description": str(error)}, 400)
        return Response(stats.model_dump_json(), media_type="application/json")

    inspector.mount(server, service, tokens)  # the /ui page and its JSON API
    return server
