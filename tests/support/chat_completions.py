"""A fake of OpenAI's Chat Completions API over HTTP, on 127.0.0.1: the model of a GitHub Copilot CLI session
offline (``COPILOT_OFFLINE=true``, ``COPILOT_PROVIDER_BASE_URL``). Each answer is the ``script``'s for the request,
streamed as the API streams it (chunks of server-sent events, then ``[DONE]``) or whole: text, then at most one tool
call, named as the request offers it (Copilot names an MCP server's tools ``<server>-<tool>``)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.fake_api import Answer, FakeModel, Reply, Script, serve, sse, whole

__all__ = ["FakeModel", "Reply", "Script", "fake_model", "tool_calls"]

CALL_IDS = itertools.count(1)


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool:
        call = {"id": f"call_fake_{next(CALL_IDS)}", "type": "function",
                "function": {"name": reply.tool, "arguments": json.dumps(reply.arguments or {})}}  # fmt: skip
        message["tool_calls"] = [call]
    return message


def _answer(reply: Reply, body: dict[str, Any]) -> Answer:
    message, model = _message(reply), str(body.get("model", "fake"))
    finish = "tool_calls" if reply.tool else "stop"
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    base = {"id": "chatcmpl-fake", "created": 0, "model": model}
    if not body.get("stream"):
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return whole({**base, "object": "chat.completion", "choices": [choice], "usage": usage})
    delta = {**message, "tool_calls": [{"index": 0, **call} for call in message.get("tool_calls", [])]}
    if not delta["tool_calls"]:
        del delta["tool_calls"]
    chunk = {**base, "object": "chat.completion.chunk"}
    return sse(
        [
            (None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
            (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
            (None, {**chunk, "choices": [], "usage": usage}),
            (None, "[DONE]"),
        ]
    )


@contextmanager
def fake_model(script: Script) -> Iterator[FakeModel]:
    """The fake API on a free loopback port while the context lasts; every request to ``.../chat/completions`` is
    kept."""

    def route(path: str, body: dict[str, Any]) -> Answer:
        if not path.split("?")[0].endswith("/chat/completions"):
            return whole({"error": {"message": f"no {path} here"}}, kept=False)
        return _answer(script(body), body)

    with serve(route, listing={"object": "list", "data": [{"id": "fake-model", "object": "model"}]}) as model:
        yield model


def tool_calls(request: dict[str, Any], tool: str) -> list[dict[str, Any]]:
    """The arguments of each call of ``tool`` in a request's messages so far."""
    return [
        json.loads(call["function"]["arguments"])
        for message in request.get("messages") or []
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if call["function"]["name"] == tool
    ]
