"""The MCP server over one :class:`MemoryService`: the tools of the ``tool_profile`` setting
(:mod:`~memrl_mcp.surface.tools`), the resources, the prompt and the instructions. The transports serve it
(:mod:`memrl_mcp.transports`), an HTTP one with its operators' routes and the inspector beside it.

With a :class:`~memrl_mcp.surface.auth.TokenTable`, the HTTP transports require a bearer token, and every tool,
resource and route sees only the namespaces of the caller's token. A call that names no namespace uses the
token's first one, else one derived from the client's project root (:mod:`memrl_mcp.surface.roots`), else the
``namespace`` setting."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.tools import Tool

from memrl_mcp import __version__
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.projects import Project, folder_uri, project_of
from memrl_mcp.requests import StatsQuery
from memrl_mcp.settings import ALL_NAMESPACES, TOOL_PROFILES, LearningSettings, Settings
from memrl_mcp.surface.asking import OpenQuestions
from memrl_mcp.surface.auth import TokenTable, caller
from memrl_mcp.surface.calls import served
from memrl_mcp.surface.feedback import Feedback
from memrl_mcp.surface.observability import Metrics
from memrl_mcp.surface.recalls import Reader, add_recall_resource
from memrl_mcp.surface.roots import roots_project
from memrl_mcp.surface.schema import Arguments, MemoryTool, argument_values
from memrl_mcp.surface.tools import TOOLS
from memrl_mcp.validation import client_name

TOKEN_REQUIRED = "authorization: a valid bearer token is required"
PROJECT_SESSION = "a session of this project (its project's namespace, its folder's earlier one, and other_namespaces)"


def instructions(profile: str, learning: LearningSettings) -> str:
    """The server's instructions (a client may hand them to its model): the loop of the tools ``profile`` offers."""
    if profile == "read_only":
        return (
            "A read-only episodic memory of past experiences: nothing you do changes it. At the start of a task, "
            "search_experience(task) finds experiences of similar tasks: follow the successes, avoid the mistakes "
            "of the failures. recall_step_advice(task, observation) advises on a step of a task of many steps; "
            "list_memories and memory_stats browse the memory."
        )
    if profile == "hooks":
        return (
            "The session of a client's hooks: recall_experience(task) for each prompt, record_evidence(recall_id, "
            "checks) with what happened (test runs, builds, edits, the user's verdict), and report_outcome(recall_id, "
            f"reward, experience) when the task is over. Reward: {learning.reward_scale}."
        )
    text = (
        "An episodic memory that learns which past experiences help. For every task: call recall_experience(task) "
        "first; follow the successful memories and avoid the mistakes of the failed ones; when the task is over, "
        f"call report_outcome(recall_id, reward, experience) once. Reward: {learning.reward_scale}; in a chat, ask "
        "the user or infer it from their reaction. Experience: on "
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
            "memory_stats curate the memory; record_evidence hands in what happened in a task (test runs, builds, the "
            "user's verdict), which then decides its reward."
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
    metrics: Metrics | None = None,
    questions: OpenQuestions | None = None,
) -> MCPServer:
    """An MCP server exposing ``service``; with ``tokens``, its HTTP transports require one; ``single_client``: it
    serves one client only (stdio). The caller owns the service and closes it. It offers the tools of the
    ``tool_profile`` setting. ``settings``: those of this server's client when they are not the service's (a session
    of the local server): its tool profile and descriptions, its bounds on questions and samplings, and its default
    namespace; the memory's own groups are the service's. ``metrics``: where its tool calls are counted (an HTTP
    transport's ``/metrics`` shows them); default, a registry of its own. ``questions``: the open questions it shares
    with other servers over the service (the local server's, one MCP server per settings of its sessions); default,
    its own."""
    settings = settings or service.settings
    serving = settings.serving
    assert set(TOOLS) == set(TOOL_PROFILES["full"]), "a tool is missing from the full profile"
    metrics = metrics or Metrics(service)
    feedback = Feedback(service, reports_on_loop=single_client, settings=settings, questions=questions)
    arguments = Arguments(service.limits, argument_values(settings, service.scale.delta))
    callers = Callers(settings, tokens, on_this_machine=single_client)
    shows = serving.max_recall_chars
    tools: list[Tool] = [
        MemoryTool.strict(
            served(tool, arguments, service, feedback, callers.tool_caller, metrics, single_client, shows),
            tool.title,
            serving.tool_descriptions.get(name) or paragraphs(tool.run.__doc__ or ""),
            tool.hints,
        )
        for name, tool in TOOLS.items()
        if name in TOOL_PROFILES[serving.tool_profile]
    ]
    auth = None
    if tokens is not None:
        # Static bearer tokens: no OAuth authorization server and no metadata routes, only verification.
        auth = AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None)
    server = MCPServer(
        name="memrl-mcp",
        instructions=instructions(serving.tool_profile, settings.learning),
        version=__version__,
        token_verifier=tokens,
        auth=auth,
        tools=tools,
    )
    _add_resources(server, service, callers.resource_caller)
    _add_prompt(server, settings)
    return server


@dataclasses.dataclass(frozen=True)
class Callers:
    """Who makes a call: the token of the request that carried it (:func:`~memrl_mcp.surface.auth.caller`), with
    the default namespace of the client's ``settings``. ``on_this_machine``: the clients' roots name folders of this
    machine (stdio, the local server's sessions), whose git repositories are their projects."""

    settings: Settings
    tokens: TokenTable | None
    on_this_machine: bool = False

    async def tool_caller(self, ctx: Context[Any, Any]) -> Access:
        """A tool's caller (:meth:`resource_caller`), refused as a tool error."""
        try:
            return await self.resource_caller(ctx)
        except ResourceError as error:
            raise MemoryRequestError(str(error)) from None

    async def resource_caller(self, ctx: Context[Any, Any]) -> Access:
        """Who sends this request: its token's namespaces; when its token names no default namespace, the one of the
        client's project (its root, else the ``project_dir`` setting: :func:`~memrl_mcp.projects.project_of`), else
        the client's ``namespace`` setting.

        A session of a project without a token reaches its project's namespace, its folder's earlier one, and
        ``other_namespaces`` alone (``["*"]``: every namespace): with recalls made for every prompt, a namespace
        another project could reach would be a channel from that project's files into this one's prompts. A session
        with no project, or with a token (whose namespaces an operator granted), is not confined further. A project's
        recalls search its earlier namespace too (``also_recalled``): its memories from before are the project's."""
        access = caller(ctx.request_context.request, self.tokens)
        if access is None:  # over HTTP the SDK answered 401 already; this is a call without HTTP, or a bug
            raise ResourceError(TOKEN_REQUIRED)
        params = ctx.session.client_params  # the handshake's, or what a 2026-07-28 request says of its client
        access = dataclasses.replace(access, client_name=client_name(params and params.client_info.name))
        if access.default is not None:
            return access
        namespaces = self.settings.namespaces
        project = None
        if namespaces.namespace_from_roots and not self.settings.is_set("namespace"):
            project = await roots_project(ctx, self.on_this_machine) or self._folder_project()
        if project is None:
            return dataclasses.replace(access, default=namespaces.namespace)
        earlier = () if project.earlier is None else (project.earlier,)
        if self.tokens is not None or ALL_NAMESPACES in namespaces.other_namespaces:
            return dataclasses.replace(access, default=project.namespace, also_recalled=earlier)
        reach = frozenset({project.namespace, *earlier, *namespaces.other_namespaces})
        confined = Access(reach, project.namespace, access.client, holder=PROJECT_SESSION, also_recalled=earlier)
        return dataclasses.replace(confined, client_name=access.client_name)

    def _folder_project(self) -> Project | None:
        """The project of the ``project_dir`` setting (what a client that sends no roots says of its project): a
        folder of this server's machine, whatever the transport."""
        folder = self.settings.namespaces.project_dir
        return None if folder is None else project_of(folder_uri(folder))


def _add_resources(server: MCPServer, service: MemoryService, reader: Reader) -> None:
    """The statistics, the settings, and one memory with its Q history, as resources."""

    async def stats(ctx: Context[Any, Any], namespace: str | None = None) -> str:
        access = await reader(ctx)
        try:
            found = await anyio.to_thread.run_sync(lambda: service.stats(StatsQuery(namespace), access=access))
            return found.model_dump_json()
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
    async def memory(memory_id: str, ctx: Context[Any, Any]) -> str:
        access = await reader(ctx)
        try:
            found = await anyio.to_thread.run_sync(lambda: service.get(memory_id, access=access))
            return found.model_dump_json()
        except MemoryRequestError as error:
            raise ResourceError(str(error)) from None

    add_recall_resource(server, service, reader)


def _add_prompt(server: MCPServer, settings: Settings) -> None:
    """``memory_loop``: the instructions and the loop's steps for one task."""
    scale, read_only = settings.learning.reward_scale, settings.serving.read_only

    @server.prompt(title="Learn from experience", description="Teaches the recall -> act -> report loop.")
    def memory_loop(task: str) -> str:
        if read_only:
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
                f"4. Call report_outcome with the recall_id, a reward ({scale}), and an experience: on success 3-5 "
                "steps that worked, on failure what went wrong and what to avoid."
            )
        return f"{server.instructions}\n\nTask: {task}\n\n{steps}"
