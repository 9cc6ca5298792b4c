"""A fake of Anthropic's Messages API over HTTP, on 127.0.0.1: the model is the one part of a Claude Code session
that cannot run here. Claude Code's CLI talks to it through ``ANTHROPIC_BASE_URL``; everything else (the CLI, its
hooks, its MCP client, the memory server) is real. Each answer is the ``script``'s for the request: text and at
most one tool call, streamed as the API streams it (server-sent events) or whole."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.fake_api import Answer, FakeModel, Reply, Script, serve, sse, whole

__all__ = ["FakeModel", "Reply", "Script", "fake_model"]

TOOL_USE_IDS = itertools.count(1)  # each tool call of a conversation has an id of its own


def _events(reply: Reply, model: str) -> list[dict[str, Any]]:
    start: dict[str, Any] = {"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    blocks: list[tuple[dict[str, Any], dict[str, Any]]] = []
    if reply.text:
        blocks.append(({"type": "text", "text": ""}, {"type": "text_delta", "text": reply.text}))
    if reply.tool:
        use = {"type": "tool_use", "id": f"toolu_fake_{next(TOOL_USE_IDS)}", "name": reply.tool, "input": {}}
        blocks.append((use, {"type": "input_json_delta", "partial_json": json.dumps(reply.arguments or {})}))
    for index, (block, delta) in enumerate(blocks):
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    stop = "tool_use" if reply.tool else "end_turn"
    events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": 1}})  # fmt: skip
    events.append({"type": "message_stop"})
    return events


def _whole(reply: Reply, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    if reply.tool:
        content.append({"type": "tool_use", "id": f"toolu_fake_{next(TOOL_USE_IDS)}", "name": reply.tool,
                        "input": reply.arguments or {}})  # fmt: skip
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "tool_use" if reply.tool else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip


@contextmanager
def fake_model(script: Script) -> Iterator[FakeModel]:
    """The fake API on a free loopback port while the context lasts; every request to ``/v1/messages`` is kept."""

    def route(path: str, body: dict[str, Any]) -> Answer:
        if not path.startswith("/v1/messages") or "count_tokens" in path:
            return whole({"input_tokens": 1}, kept=False)
        reply, model = script(body), str(body.get("model", "fake"))
        if not body.get("stream"):
            return whole(_whole(reply, model))
        return sse([(event["type"], event) for event in _events(reply, model)])

    with serve(route) as model:
        yield model
