"""The MCP face of the memory: tools, resources and a prompt over one :class:`MemoryService`, plus the
HTTP routes operators use: ``/health``, ``/metrics`` (Prometheus) and ``/stats``.

With a :class:`~memrl_mcp.serving.auth.TokenTable`, the HTTP transports require a bearer token, and every tool,
resource and ``/stats`` sees only the namespaces of the caller's token. A call that names no namespace uses the
token's first one, else one derived from the client's project root (:mod:`memrl_mcp.serving.roots`), else the
``namespace`` setting."""

import dataclasses
import inspect
import re
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memrl_mcp import __version__
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import (
    ForgetResult,
    MemoryDetail,
    MemoryPage,
    RecallQuery,
    RecallResult,
    ReportResult,
    SearchResult,
    Stats,
    StepAdviceResult,
    StoreResult,
    TrajectoryResult,
)
from memrl_mcp.serving import inspector
from memrl_mcp.serving.asking import Asking
from memrl_mcp.serving.auth import TokenTable, caller
from memrl_mcp.serving.calls import OnLoop, served
from memrl_mcp.serving.feedback import Feedback
from memrl_mcp.serving.observability import Metrics
from memrl_mcp.serving.projects import folder_uri, project_namespace
from memrl_mcp.serving.recalls import add_recall_resource
from memrl_mcp.serving.roots import roots_namespace
from memrl_mcp.serving.schema import MemoryTool
from memrl_mcp.settings import TOOL_PROFILES, LearningSettings, Settings
from memrl_mcp.validation import (
    MAX_EPISODE_ID_CHARS,
    MAX_METADATA_DEPTH,
    CandidateCount,
    NamespaceName,
    Outcome,
    QWeight,
    Similarity,
    SortKey,
    TextQuery,
    text_rule,
)

R = TypeVar("R")

Namespace = Annotated[
    NamespaceName | None, Field(description="Memory namespace (one per project or agent); default: the server's.")
]
TOKEN_REQUIRED = "authorization: a valid bearer token is required"


def instructions(profile: str, learning: LearningSettings) -> str:
    """The server's instructions (a client may hand them to its model): the loop of the tools ``profile`` offers."""
    low, high, neutral = learning.reward_min, learning.reward_max, (learning.reward_min + learning.reward_max) / 2
    if profile == "read_only":
        return (
            "A read-only episodic memory of past experiences: nothing you do changes it. At the start of a task, "
            "search_experience(task) finds experiences of similar tasks: follow the successes, avoid the mistakes "
            "of the failures. recall_step_advice(task, observation) advises on a step of a task of many steps; "
            "list_memories and memory_stats browse the memory."
        )
    text = (
        "An episodic memory that learns which past experiences help. For every task: call recall_experience(task) "
        "first; follow the successful memories and avoid the mistakes of the failed ones; when the task is over, "
        f"call report_outcome(recall_id, reward, experience) once. Reward: {high:g} success, {low:g} failure, "
        f"{neutral:g} no clear outcome; in a chat, ask the user or infer it from their reaction. Experience: on "
        "success 3-5 steps that worked, on failure what went wrong and what to avoid. store_experience keeps a "
        "lesson that no recall led to."
    )
    if profile in ("steps", "full"):
        text += (
            "\nFor a task of many steps (a game, a shell or database session), also call recall_step_advice(task, "
            "observation) at each step, and report_trajectory(task, steps, episode_id) once at the end."
        )
    if profile == "full":
        text += (
            "\nsearch_experience looks up without learning; list_memories, update_memory, forget_experience and "
            "memory_stats curate the memory."
        )
    return text


def paragraphs(docstring: str) -> str:
    """A docstring as a tool description: without the source's indentation and line breaks (one line per
    paragraph), as a model reads a description and a client shows it."""
    return re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(docstring))


def create_server(
    service: MemoryService,
    tokens: TokenTable | None = None,
    single_client: bool = False,
    settings: Settings | None = None,
) -> MCPServer:
    """An MCP server exposing ``service``; with ``tokens``, its HTTP transports require one; ``single_client``: it
    serves one client only (stdio). The caller owns the service and closes it. It offers the tools of the
    ``tool_profile`` setting. ``settings``: those of this server's client when they are not the service's (a session
    of the local server): its tool profile and descriptions and its default namespace; the memory's own groups are
    the service's."""
    settings, rules = settings or service.settings, service.limits
    limits, learning, retrieval = settings.limits, settings.learning, settings.retrieval
    serving = settings.serving
    metrics = Metrics(service)
    feedback = Feedback(service, reports_on_loop=single_client)
    low, high = learning.reward_min, learning.reward_max
    Task = Annotated[
        rules.task.type,
        Field(description=f"The task at hand, in plain words (max {limits.max_task_chars} characters)."),
    ]
    Metadata = Annotated[
        rules.metadata.type | None,
        Field(
            description="Labels kept with the memory (benchmark, task id...): a JSON object of at most "
            f"{limits.max_metadata_chars} characters, {MAX_METADATA_DEPTH} levels deep."
        ),
    ]
    Reward = Annotated[
        rules.reward.type,
        Field(
            description=f"How the task went, in [{low:g}, {high:g}]: {high:g} success; {low:g} failure (or the "
            f"memories misled you); {(low + high) / 2:g} no clear outcome (partly done, no sign either way), which "
            "still pulls the recalled memories toward neutral. In a chat, where you cannot check success yourself, "
            "ask the user, or infer it from their reaction: thanks or moving on is a success; a correction, a "
            "complaint or the same request again is a failure. Leave it out and the server asks the user itself, "
            "when the client lets it."
        ),
    ]
    Trajectory = Annotated[
        text_rule(limits.max_trajectory_chars).type | None,
        Field(
            description="Instead of experience: what happened in the task, as text (max "
            f"{limits.max_trajectory_chars} characters); the client's model writes the experience from it."
        ),
    ]
    K1 = Annotated[CandidateCount | None, Field(description=f"Similar memories considered (default {retrieval.k1}).")]
    K2 = Annotated[CandidateCount | None, Field(description=f"Memories returned, at most k1 (default {retrieval.k2}).")]
    QWeightArgument = Annotated[
        QWeight | None,
        Field(description=f"0 ranks by similarity only, 1 by past usefulness only (default {retrieval.q_weight:g})."),
    ]
    Delta = Annotated[
        Similarity | None,
        Field(description=f"Lowest task similarity a memory needs (default {service.scale.delta:.2f})."),
    ]

    from_roots = settings.namespaces.namespace_from_roots and not settings.is_set("namespace")
    project_dir = settings.namespaces.project_dir
    folder_namespace = project_namespace(folder_uri(project_dir)) if project_dir is not None else None

    async def identify(ctx: Context[Any, Any]) -> Access:
        """A tool's caller: the token of the request that carried the call, and, when neither that token nor
        the settings name a default namespace, the one of the session's project (the client's root, else
        ``project_dir``)."""
        access = caller(ctx.request_context.request, tokens)
        if access is None:  # over HTTP the SDK answered 401 already; this is a call without HTTP, or a bug
            raise MemoryRequestError(TOKEN_REQUIRED)
        if access.default is not None:
            return access
        project = None
        if from_roots:
            project = await roots_namespace(ctx) or folder_namespace
        return dataclasses.replace(access, default=project or settings.namespaces.namespace)

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
        q_weight: QWeightArgument = None,
        delta: Delta = None,
        *,
        access: Access,
    ) -> RecallResult:
        """Call at the start of every task, before acting. Returns past experiences of similar tasks, best first
        (ranked by similarity and by how much each helped before), and a recall_id. Follow the procedures of the
        successes; avoid what the failures warn about. No memory is a valid answer (a new kind of task). When the
        task is over, call report_outcome with the recall_id, once."""
        return service.recall(RecallQuery(task, namespace, k1, k2, q_weight, delta), access=access)

    def search_experience(
        task: Task,
        namespace: Namespace = None,
        k1: K1 = None,
        k2: K2 = None,
        q_weight: QWeightArgument = None,
        delta: Delta = None,
        *,
        access: Access,
    ) -> SearchResult:
        """Look memories up like recall_experience, without a recall: nothing is logged, there is nothing to
        report, and nothing learns from this use. For browsing, or a retrieval-only baseline; an agent working on
        a task calls recall_experience instead."""
        return service.search(RecallQuery(task, namespace, k1, k2, q_weight, delta), access=access)

    async def report_outcome(
        recall_id: Annotated[str, Field(description="The recall_id that recall_experience returned.")],
        reward: Reward | None = None,
        experience: Annotated[
            rules.experience.type | None,
            Field(
                description="What to remember from this task: on success 3-5 short steps that worked; on failure "
                f"what went wrong and what to avoid (max {limits.max_experience_chars} characters)."
            ),
        ] = None,
        outcome: Annotated[
            Outcome | None, Field(description="success or failure; default: success when the reward is above 0.")
        ] = None,
        metadata: Metadata = None,
        trajectory: Trajectory = None,
        *,
        access: Access,
        client: Asking,
    ) -> ReportResult:
        """Call once when the task is over (done, failed or abandoned), with the recall_id of recall_experience.
        The reward teaches the memory which of the recalled experiences help; the experience is kept as a new
        memory for the next similar task."""
        return await feedback.report(
            client, recall_id, reward, experience, trajectory, outcome, metadata, access=access
        )

    def recall_step_advice(
        task: Task,
        observation: Annotated[
            rules.observation.type,
            Field(
                description="What you see now (max "
                f"{limits.max_observation_chars} characters; the head and tail of a long one are matched)."
            ),
        ],
        namespace: Namespace = None,
        k: Annotated[
            CandidateCount | None,
            Field(description=f"Remembered steps to match (default {settings.steps.step_k})."),
        ] = None,
        *,
        access: Access,
    ) -> StepAdviceResult:
        """For a task of many steps (a game, a shell or database session): call at each step with what you see
        now. Returns the actions that led to success in similar situations (encouraged) and those that did not
        (discouraged). Read-only. At the end of the episode, report every step with report_trajectory."""
        return service.recall_step_advice(task, observation, namespace, k, access=access)

    async def report_trajectory(
        task: Task,
        steps: Annotated[
            rules.steps.type,
            Field(
                description=f"Every step of the episode in order, at most {limits.max_trajectory_steps}: "
                "{observation, action, reward}. A step's reward is what followed it at once, usually 0; the last "
                f"one's is the episode's ({high:g} success, {low:g} failure, as in report_outcome)."
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
                description="The recall_id of recall_experience for this episode, if any: it is reported too, "
                "with the last step's reward.",
            ),
        ] = None,
        *,
        access: Access,
        client: Asking,
    ) -> TrajectoryResult:
        """Call once at the end of a task of many steps, with every step: the step memory learns which actions led
        to success and which went wrong, and recall_step_advice will say so."""
        return await feedback.report_trajectory(client, task, steps, episode_id, namespace, recall_id, access=access)

    async def store_experience(
        task: Annotated[
            rules.task.type, Field(description=f"The task the experience is about (max {limits.max_task_chars}).")
        ],
        experience: Annotated[
            rules.experience.type | None,
            Field(description=f"What to reuse or avoid (max {limits.max_experience_chars} characters)."),
        ] = None,
        namespace: Namespace = None,
        outcome: Annotated[Outcome, Field(description="success (to follow) or failure (to avoid).")] = "success",
        q: Annotated[rules.reward.type | None, Field(description="Initial usefulness; default: the server's.")] = None,
        metadata: Metadata = None,
        trajectory: Trajectory = None,
        *,
        access: Access,
        client: Asking,
    ) -> StoreResult:
        """Keep a lesson that no recall led to: something the user asks you to remember, or a procedure learned
        outside a task. After a recalled task, report_outcome stores its experience and also teaches the memory.
        A near-duplicate task with the same outcome updates that memory instead of adding a twin."""
        return await feedback.store(
            client, task, experience, trajectory, namespace, outcome, q, metadata, access=access
        )

    def forget_experience(
        memory_id: Annotated[str | None, Field(description="Delete this one memory.")] = None,
        namespace: Annotated[
            NamespaceName | None, Field(description="Delete every memory, recall and step of this namespace.")
        ] = None,
        *,
        access: Access,
    ) -> ForgetResult:
        """Delete one memory by id, or all of a namespace (give exactly one of the two). It cannot be undone."""
        return service.forget(memory_id, namespace, access=access)

    def memory_stats(
        namespace: Annotated[NamespaceName | None, Field(description="One namespace; default: all.")] = None,
        *,
        access: Access,
    ) -> Stats:
        """Counts of memories (successes, failures), the spread of their learned usefulness q, rewards received,
        recalls pending and reported, step records."""
        return service.stats(namespace, access=access)

    def list_memories(
        namespace: Namespace = None,
        outcome: Annotated[Outcome | None, Field(description="Only successes, or only failures.")] = None,
        q_min: Annotated[rules.reward.type | None, Field(description="Only memories with q >= q_min.")] = None,
        q_max: Annotated[rules.reward.type | None, Field(description="Only memories with q <= q_max.")] = None,
        text: Annotated[
            TextQuery | None,
            Field(description="Only memories whose task or experience holds every word of this text (any case)."),
        ] = None,
        sort: Annotated[SortKey, Field(description="q (learned usefulness), visits, or updated_at.")] = "updated_at",
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
        """Page through what the memory holds: each memory's task, experience, outcome, learned usefulness q
        (the reward it brought on average), visits and last reward. One memory's history of q is the resource
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
            Field(description="Forget what was learned: q back to its initial value and visits to 0."),
        ] = False,
        *,
        access: Access,
    ) -> MemoryDetail:
        """Correct a memory: replace its experience and/or its metadata (the limits of store_experience). Its task,
        outcome, q and visits stay, unless reset_q forgets what was learned."""
        return service.update_memory(memory_id, experience, metadata, reset_q, access=access)

    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    destroys = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)
    retried = writes.model_copy(update={"idempotent_hint": True})
    every_tool = {
        "recall_experience": (recall_experience, "Recall past experience", writes),
        "report_outcome": (report_outcome, "Report a task's outcome", writes),
        "store_experience": (store_experience, "Store an experience", retried),
        "recall_step_advice": (recall_step_advice, "Advice for this step", reads),
        "report_trajectory": (report_trajectory, "Report a task of many steps", retried),
        "search_experience": (search_experience, "Search memories without learning", reads),
        "list_memories": (list_memories, "List memories", reads),
        "update_memory": (update_memory, "Correct a memory", writes.model_copy(update={"destructive_hint": True})),
        "forget_experience": (forget_experience, "Forget memories", destroys),
        "memory_stats": (memory_stats, "Memory statistics", reads),
    }
    assert set(every_tool) == set(TOOL_PROFILES["full"]), "a tool is missing from the full profile"
    # One client (stdio): its hot calls that run no model are served on the event loop (a recall whose task's
    # embedding is cached; a report that asks nobody: Feedback's reports_on_loop), a millisecond or two of store calls
    # that may wait for the store's write lock (a flush, a swap): only that client's own requests wait with them.
    # With several clients, every call runs in a worker thread, and a call waiting for the store holds back no one
    # else. (A report that asks the client awaits it on the loop; its store calls go to worker threads.)
    on_loop: dict[str, OnLoop] = {}
    if single_client:
        on_loop["recall_experience"] = lambda access, arguments: (
            not service.runs_model(arguments["task"], arguments.get("namespace"), access=access)
        )
    tools = [
        MemoryTool.strict(
            served(fn, identify, metrics, on_loop.get(name)),
            title,
            serving.tool_descriptions.get(name) or paragraphs(fn.__doc__ or ""),
            annotations,
        )
        for name, (fn, title, annotations) in every_tool.items()
        if name in TOOL_PROFILES[serving.tool_profile]
    ]
    auth = None
    if tokens is not None:
        # Static bearer tokens: no OAuth authorization server and no metadata routes, only verification.
        auth = AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None)
    server = MCPServer(
        name="memrl-mcp",
        instructions=instructions(serving.tool_profile, learning),
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

    add_recall_resource(server, service, reader)

    @server.prompt(title="Learn from experience", description="Teaches the recall -> act -> report loop.")
    def memory_loop(task: str) -> str:
        if serving.read_only:
            steps = (
                "1. Call search_experience with this task.\n"
                "2. Read the memories: follow the procedures of successes; avoid what the failures warn about.\n"
                "3. Do the task."
            )
        else:
            steps = (
                "1. Call recall_experience with this task. Keep the recall_id.\n"
                "2. Read the memories: follow the procedures of successes; avoid what the failures warn about.\n"
                "3. Do the task.\n"
                f"4. Call report_outcome with the recall_id, a reward ({high:g} success, {low:g} failure, "
                f"{(low + high) / 2:g} no clear outcome), and an experience: on success 3-5 steps that worked, on "
                "failure what went wrong and what to avoid."
            )
        return f"{server.instructions}\n\nTask: {task}\n\n{steps}"

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
