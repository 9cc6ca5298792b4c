"""A fake of OpenAI's Responses API over HTTP, on 127.0.0.1: the model of a Codex CLI session (its
``model_providers`` entry's ``base_url``, ``wire_api = "responses"``). Each answer is the ``script``'s for the
request, streamed as the API streams it (server-sent events): a message, then at most one function call.

Codex offers an MCP server's tools as a namespace (``{"type": "namespace", "name": "mcp__memrl", "tools": [...]}``)
and takes a call of one only with that namespace beside the tool's own name; a :class:`Reply` names it whole
(``mcp__memrl__report_outcome``), as Codex's hooks do."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.fake_api import Answer, FakeModel, Reply, Script, serve, sse, whole

__all__ = ["FakeModel", "Reply", "Script", "fake_model", "function_calls"]

CALL_IDS = itertools.count(1)


def _call(reply: Reply, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The function call item of ``reply``'s tool, in its namespace when the request offered it in one."""
    assert reply.tool is not None
    name, where = reply.tool, {}
    for offered in tools:
        prefix = f"{offered.get('name')}__"
        if offered.get("type") == "namespace" and name.startswith(prefix):
            name, where = name.removeprefix(prefix), {"namespace": offered["name"]}
    number = next(CALL_IDS)
    return {"type": "function_call", "id": f"fc_fake_{number}", "call_id": f"call_fake_{number}", "name": name,
            "arguments": json.dumps(reply.arguments or {}), "status": "completed", **where}  # fmt: skip


def _items(reply: Reply, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text:
        content = [{"type": "output_text", "text": reply.text, "annotations": []}]
        items.append(
            {"type": "message", "id": "msg_fake", "role": "assistant", "status": "completed", "content": content}
        )
    if reply.tool:
        items.append(_call(reply, tools))
    return items


def _stream(items: list[dict[str, Any]], model: str) -> Answer:
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2}  # fmt: skip
    response = {"id": "resp_fake", "object": "response", "status": "completed", "model": model, "output": items,
                "usage": usage}  # fmt: skip
    events: list[tuple[str | None, Any]] = [
        ("response.created", {"type": "response.created", "response": {"id": "resp_fake", "status": "in_progress"}})
    ]
    for index, item in enumerate(items):
        for kind in ("response.output_item.added", "response.output_item.done"):
            events.append((kind, {"type": kind, "output_index": index, "item": item}))
    events.append(("response.completed", {"type": "response.completed", "response": response}))
    return sse(events)


@contextmanager
def fake_model(script: Script) -> Iterator[FakeModel]:
    """The fake API on a free loopback port while the context lasts; every request to ``.../responses`` is kept."""

    def route(path: str, body: dict[str, Any]) -> Answer:
        if not path.split("?")[0].endswith("/responses"):
            return whole({"error": {"message": f"no {path} here"}}, kept=False)
        return _stream(_items(script(body), body.get("tools") or []), str(body.get("model", "fake")))

    with serve(route, listing={"object": "list", "data": [], "models": []}) as model:
        yield model


def function_calls(request: dict[str, Any], tool: str) -> list[dict[str, Any]]:
    """The arguments of each call of ``tool`` (named whole, namespace first) in a request's input so far."""
    return [
        json.loads(item["arguments"])
        for item in request.get("input") or []
        if item.get("type") == "function_call"
        and "__".join(filter(None, [item.get("namespace"), item["name"]])) == tool
    ]
