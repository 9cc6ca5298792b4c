"""How a tool is declared (:func:`tool`, :class:`ToolDef`) and how the SDK runs it (:func:`served`): the arguments
checked into the tool's typed request, the caller resolved from the request that carried the call, the body in a
worker thread or on the event loop, the call timed and counted, a refusal turned into a tool error, the result
handed over in its wire form."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, get_type_hints

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from mcp_types import InputRequiredResult
from pydantic import BaseModel

from memrl_mcp.errors import MemrlError
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import SearchResult
from memrl_mcp.surface.asking import Asking, InputRequiredError
from memrl_mcp.surface.feedback import Feedback
from memrl_mcp.surface.observability import Metrics
from memrl_mcp.surface.schema import Arguments
from memrl_mcp.surface.text import structured, text

Request = TypeVar("Request")
Result = BaseModel | Awaitable[BaseModel]
OnLoop = Callable[[MemoryService, Any, Access], bool]
"""Whether a call (the service, its request, its caller) is short enough to be served on the event loop."""


@dataclass(frozen=True)
class ToolCall:
    """What a tool function is handed besides its request: the memory, the caller, and the way back to the
    client (its user and its model, for the tools that ask)."""

    service: MemoryService
    feedback: Feedback
    access: Access
    client: Asking
    recall_chars: int  # of experience one recall shows its model (max_recall_chars): surface.text.shown


@dataclass(frozen=True)
class ToolDef(Generic[Request]):
    """One tool: its function (whose docstring is the tool's description, and whose first parameter's type is the
    tool's request), its title and hints, and, for a server of one client, which calls run on the event loop."""

    name: str
    title: str
    hints: ToolAnnotations
    request: type[Request]
    run: Callable[[Request, ToolCall], Result]
    on_loop: OnLoop | None

    @property
    def asks(self) -> bool:
        """A coroutine: it may ask the client (:mod:`~memrl_mcp.surface.asking`), so it runs on the event loop."""
        return inspect.iscoroutinefunction(self.run)

    async def answer(self, request: Request, call: ToolCall) -> BaseModel:
        """The result of a tool that asks (:attr:`asks`), awaited on the event loop."""
        result = self.run(request, call)
        assert inspect.isawaitable(result), f"{self.name} asks: its function is a coroutine"
        return await result

    def compute(self, request: Request, call: ToolCall) -> BaseModel:
        """The result of a tool that does not ask, wherever it runs (a worker thread, or the loop)."""
        result = self.run(request, call)
        assert isinstance(result, BaseModel), f"{self.name} does not ask: its function returns its result"
        return result


def tool(
    registry: dict[str, ToolDef[Any]], title: str, hints: ToolAnnotations, on_loop: OnLoop | None = None
) -> Callable[[Callable[[Request, ToolCall], Result]], Callable[[Request, ToolCall], Result]]:
    """Register the decorated function in ``registry`` as a tool named after it."""

    def register(fn: Callable[[Request, ToolCall], Result]) -> Callable[[Request, ToolCall], Result]:
        types = get_type_hints(fn)
        taken = [types.get(name) for name in inspect.signature(fn).parameters]
        request = taken[0] if taken else None
        if len(taken) != 2 or not isinstance(request, type) or not dataclasses.is_dataclass(request):
            raise TypeError(
                f"the tool {fn.__name__} must take its request (a dataclass) and its call (ToolCall), which carries "
                "its caller's access"
            )
        if taken[1] is not ToolCall:
            raise TypeError(f"the tool {fn.__name__}'s second parameter must be its call (ToolCall)")
        registry[fn.__name__] = ToolDef(fn.__name__, title, hints, request, fn, on_loop)
        return fn

    return register


def served(
    tool: ToolDef[Request],
    arguments: Arguments,
    service: MemoryService,
    feedback: Feedback,
    identify: Callable[[Context[Any, Any]], Awaitable[Access]],
    metrics: Metrics,
    single_client: bool,
    recall_chars: int,
) -> Callable[..., Awaitable[CallToolResult | InputRequiredResult]]:
    """``tool`` as the SDK serves it: a function of the tool's arguments (each field of its request, bounded and
    described by ``arguments``) and the call's ``Context``, which ``identify`` turns into the caller's
    :class:`Access`. Every tool is served through here, so none can forget its caller's tenant or project
    namespace, and none reads the caller from anywhere but the request that carried the call.

    The body runs in a worker thread (the store's calls block, and a model run lets other requests go on
    meanwhile), or on the event loop when the server has one client and ``tool.on_loop`` says the call is short
    (docs/serving.md); a tool that asks the client runs on the loop, which it must not block, and when the client
    must answer first (2026-07-28) the call answers its ``InputRequiredResult``. Each call is timed, counted and
    logged; a refused request reaches the client as a tool error with its message (which names the field).

    The result, a model built and checked by the service, is handed to the SDK as its wire form: structured content,
    and the short text its model reads (:mod:`~memrl_mcp.surface.text`); the SDK would validate it again against the
    model and dump it twice."""
    on_loop = tool.on_loop if single_client else None

    async def run(ctx: Context[Any, Any], **given: Any) -> CallToolResult | InputRequiredResult:
        with metrics.call(tool.name) as call:
            try:
                access = await identify(ctx)
                call.client = access.client
                request = tool.request(**given)
                context = ToolCall(service, feedback, access, Asking(ctx), recall_chars)
                if tool.asks:
                    result = await tool.answer(request, context)
                elif on_loop is not None and on_loop(service, request, access):
                    result = tool.compute(request, context)
                else:
                    result = await anyio.to_thread.run_sync(tool.compute, request, context)
            except InputRequiredError as needed:  # 2026-07-28: the client asks, then calls again
                call.status = "asking"
                return needed.result
            except MemrlError as error:
                call.status = "refused"
                raise ToolError(str(error)) from None
        said = text(result)
        if isinstance(result, SearchResult):
            metrics.shown(len(said))
        return CallToolResult(content=[TextContent(type="text", text=said)], structured_content=structured(result))

    parameters = arguments.parameters(tool.request)
    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context[Any, Any])
    run.__name__ = tool.name
    # What inspect.signature, and so the SDK, reads of a function (a plain function has no such declared attribute).
    run.__dict__["__signature__"] = inspect.Signature([*parameters, context], return_annotation=CallToolResult)
    run.__annotations__ = {
        **{p.name: p.annotation for p in parameters},
        "ctx": Context[Any, Any],
        "return": CallToolResult,
    }
    return run
