"""How the SDK runs a tool body: the caller resolved from the request, the body in a worker thread or on the event
loop, the call timed and counted, a refusal turned into a tool error, the result handed over in its wire form."""

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
import pydantic_core
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from mcp_types import InputRequiredResult
from pydantic import BaseModel

from memrl_mcp.errors import MemrlError
from memrl_mcp.memory.access import Access
from memrl_mcp.serving.asking import Asking, InputRequired
from memrl_mcp.serving.observability import Metrics

OnLoop = Callable[[Access, dict[str, Any]], bool]
"""Whether a call (its caller, its arguments) is served on the event loop rather than in a worker thread."""
HIDDEN = ("access", "client")
"""A tool body's parameters that no client sets: its caller, and its way back to the client."""


def served(
    fn: Callable[..., BaseModel | Awaitable[BaseModel]],
    identify: Callable[[Context[Any, Any]], Awaitable[Access]],
    metrics: Metrics,
    on_loop: OnLoop | None = None,
) -> Callable[..., Awaitable[CallToolResult | InputRequiredResult]]:
    """The tool body ``fn``, which takes its caller as ``access``, as the SDK serves it: the SDK hands the call's
    ``Context`` (``ctx``) in place of ``access``, and ``identify`` turns it into the caller's :class:`Access`.
    Every tool is served through here, so none can forget its caller's tenant or project namespace, and none
    reads the caller from anywhere but the request that carried the call. The body runs in a worker thread (the
    store's calls block, and a model run lets other requests go on meanwhile), or on the event loop when
    ``on_loop`` says the call is short and nobody else waits for the loop (docs/serving.md). Each call is timed,
    counted and logged; a refused request reaches the client as a tool error with its message (which names the
    field). A coroutine body, one that may ask the client (:mod:`~memrl_mcp.serving.asking`), takes ``client`` too
    and runs on the event loop, which it must not block; when the client must answer first (2026-07-28), the call
    answers its ``InputRequiredResult``.

    The result, a model built and checked by the service, is handed to the SDK as its wire form (structured
    content, and the same JSON as text): the SDK would validate it again against the model and dump it twice."""
    signature = inspect.signature(fn)
    if "access" not in signature.parameters:
        raise TypeError(f"the tool {fn.__name__} must take its caller's access")
    asks = inspect.iscoroutinefunction(fn)
    if asks != ("client" in signature.parameters):
        raise TypeError(f"the tool {fn.__name__} must be a coroutine exactly when it takes client")
    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context[Any, Any])
    parameters = [*(p for p in signature.parameters.values() if p.name not in HIDDEN), context]

    @functools.wraps(fn)
    async def tool(*args: Any, ctx: Context[Any, Any], **kwargs: Any) -> CallToolResult | InputRequiredResult:
        with metrics.call(fn.__name__) as call:
            try:
                access = await identify(ctx)
                call.client = access.client
                if asks:
                    result = await fn(*args, access=access, client=Asking(ctx), **kwargs)  # type: ignore[misc]
                else:
                    body = functools.partial(fn, *args, access=access, **kwargs)
                    result = body() if on_loop and on_loop(access, kwargs) else await anyio.to_thread.run_sync(body)
            except InputRequired as needed:  # 2026-07-28: the client asks, then calls again
                call.status = "asking"
                return needed.result
            except MemrlError as error:
                call.status = "refused"
                raise ToolError(str(error)) from None
        structured = result.model_dump(mode="json")
        text = pydantic_core.to_json(structured, indent=2).decode()
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)

    tool.__signature__ = signature.replace(parameters=parameters, return_annotation=CallToolResult)  # type: ignore[attr-defined]
    tool.__annotations__ = {
        **{name: kind for name, kind in fn.__annotations__.items() if name not in (*HIDDEN, "return")},
        "ctx": Context[Any, Any],
        "return": CallToolResult,
    }
    return tool
