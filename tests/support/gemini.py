"""A fake of the Gemini API over HTTP, on 127.0.0.1: the model is the one part of a Gemini CLI session that cannot run
here. Gemini CLI talks to it through ``GOOGLE_GEMINI_BASE_URL``; everything else (the CLI, its hooks, its MCP
client, the memory server) is real.

Gemini CLI asks twice per model turn: its router first (``:generateContent`` with a JSON schema to fill: how complex
the prompt is), answered here with any object of that schema; then the model (``:streamGenerateContent?alt=sse``),
whose answer is the ``script``'s for the request: text and at most one function call, as one server-sent event.
Only the model's requests are kept: they carry the whole conversation."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.anthropic import Reply, Script


@dataclass
class FakeGemini:
    url: str
    requests: list[dict[str, Any]]


def filled(schema: dict[str, Any]) -> Any:
    """A value of a JSON schema (as Gemini CLI writes them: ``type`` in either case): an enum's first member."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        return {name: filled(inner) for name, inner in schema.get("properties", {}).items()}
    return {"string": "fake", "integer": 1, "number": 1, "boolean": False, "array": []}.get(kind)


def _answer(reply: Reply) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": reply.text}] if reply.text else []
    if reply.tool:
        parts.append({"functionCall": {"name": reply.tool, "args": reply.arguments or {}}})
    candidate = {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-fake"}


@contextmanager
def fake_gemini(script: Script, status: int = 200) -> Iterator[FakeGemini]:
    """The fake API on a free loopback port while the context lasts; every request to the model is kept. A
    ``status`` other than 200: every request fails so (an API error)."""
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            model = ":streamGenerateContent" in self.path
            if model:
                requests.append(body)
            if status != 200:
                error = {"error": {"code": status, "message": "fake failure", "status": "INVALID_ARGUMENT"}}
                self._send(status, "application/json", json.dumps(error).encode())
                return
            if not model:  # the router, or another helper asking for JSON
                schema = body.get("generationConfig", {}).get("responseJsonSchema") or {}
                answer = _answer(Reply(json.dumps(filled(schema))))
                self._send(200, "application/json", json.dumps(answer).encode())
                return
            event = f"data: {json.dumps(_answer(script(body)))}\n\n"
            self._send(200, "text/event-stream", event.encode())

        def _send(self, code: int, kind: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeGemini(f"http://127.0.0.1:{server.server_address[1]}", requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def texts(request: dict[str, Any]) -> list[str]:
    """The text parts of the user's turns in the conversation a request carries, in order: the prompts, the hooks'
    context, the held stops' reasons."""
    return [
        part["text"]
        for content in request.get("contents", [])
        if content.get("role") == "user"
        for part in content.get("parts", [])
        if "text" in part
    ]


def results(request: dict[str, Any], name: str) -> list[str]:
    """What each call of function ``name`` answered the model in the conversation so far (its response, as JSON)."""
    return [
        json.dumps(part["functionResponse"].get("response", {}))
        for content in request.get("contents", [])
        for part in content.get("parts", [])
        if part.get("functionResponse", {}).get("name") == name
    ]


def calls(request: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The arguments of each call of function ``name`` the model made in the conversation so far."""
    return [
        part["functionCall"].get("args", {})
        for content in request.get("contents", [])
        if content.get("role") == "model"
        for part in content.get("parts", [])
        if part.get("functionCall", {}).get("name") == name
    ]
