"""A scripted OpenAI-compatible chat server on 127.0.0.1, for testing LLM code over real HTTP.

The harness talks to LLMs through the ``openai`` package; rather than mocking that client,
tests point it at this server, which answers ``POST /v1/chat/completions`` with a genuine
OpenAI response body (and ``GET /v1/models``). Each request takes the next scripted step;
when the script is empty the ``responder`` (a function of the request) answers; with neither,
the server answers 400 so a test that sends more than it scripted fails at once (so does a
responder that raises: 400 is not retried, and the message names the exception).

    with FakeLLMServer() as fake:                       # or the ``fake_llm`` fixture
        fake.fail(2, status=503)                        # the next two requests get 503
        fake.script("hello", '{"a": 1}')                # then these two contents
        fake.hang(1, seconds=5)                         # then one request waits 5 s first
        fake.responder = lambda req: req.last_user      # then echo, forever
        llm = LLM(fake.base_url, "fake-model")
        ...
        fake.requests[0].messages, fake.requests[0].response_format, .temperature, .seed

Token counts are whitespace-separated words (prompt: all message contents; completion: the
answer), unless a :class:`FakeReply` sets them, so usage accounting is exactly predictable.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeReply:
    """One scripted answer: a completion (status 200) or an HTTP error, possibly late.

    ``body`` replaces the whole JSON body when set (for malformed or unusual responses).
    """

    content: str = ""
    status: int = 200
    delay: float = 0.0
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass(frozen=True)
class RecordedRequest:
    """What the client sent: the parsed JSON body, lower-cased headers, arrival (monotonic) time."""

    index: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def last_user(self) -> str:
        users = [m.get("content") or "" for m in self.messages if m.get("role") == "user"]
        return str(users[-1]) if users else ""

    @property
    def response_format(self) -> dict[str, Any] | None:
        return self.body.get("response_format")

    @property
    def temperature(self) -> float | None:
        return self.body.get("temperature")

    @property
    def seed(self) -> int | None:
        return self.body.get("seed")

    @property
    def max_tokens(self) -> int | None:
        return self.body.get("max_tokens", self.body.get("max_completion_tokens"))

    @property
    def model(self) -> str | None:
        return self.body.get("model")


Step = str | FakeReply | Callable[[RecordedRequest], "str | FakeReply"]


def _words(text: Any) -> int:
    return len(str(text or "").split())


class FakeLLMServer:
    """The server; thread-safe, so concurrent clients each take their own step."""

    def __init__(self, *, model: str = "fake-model", responder: Step | None = None) -> None:
        self.model = model
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._steps: deque[Step] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- scripting -----------------------------------------------------------------------

    def script(self, *steps: Step) -> FakeLLMServer:
        """Queue answers: a string is the reply content; a function gets the request."""
        with self._lock:
            self._steps.extend(steps)
        return self

    def fail(self, n: int = 1, status: int = 503, *, message: str = "", retry_after: float | None = None) -> None:
        """Queue ``n`` HTTP errors (OpenAI error body; ``Retry-After`` header when given)."""
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        self.script(*(FakeReply(status=status, content=message, headers=dict(headers)) for _ in range(n)))

    def hang(self, n: int = 1, seconds: float = 5.0, content: str = "late") -> None:
        """Queue ``n`` answers sent only after ``seconds`` (past the client's timeout, to test it)."""
        self.script(*(FakeReply(content=content, delay=seconds) for _ in range(n)))

    @property
    def pending(self) -> int:
        """Scripted steps not yet used (a test can assert its script was consumed)."""
        with self._lock:
            return len(self._steps)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeLLMServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeLLMServer:
        server = self

        class Handler(_Handler):
            fake = server

        self._stopping.clear()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; requests still hanging are released (their clients have gone)."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- answering -----------------------------------------------------------------------

    def _record(
        self, path: str, headers: Iterable[tuple[str, str]], body: dict[str, Any]
    ) -> tuple[RecordedRequest, FakeReply]:
        with self._lock:
            request = RecordedRequest(
                len(self.requests), path, {k.lower(): v for k, v in headers}, body, time.monotonic()
            )
            self.requests.append(request)
            step: Step | None = self._steps.popleft() if self._steps else self.responder
        return request, self._resolve(request, step)

    def _resolve(self, request: RecordedRequest, step: Step | None) -> FakeReply:
        if step is None:
            return FakeReply(status=400, content=f"fake LLM: no scripted reply left for request #{request.index}")
        if callable(step):
            step = step(request)
        return FakeReply(content=step) if isinstance(step, str) else step

    def completion_body(self, request: RecordedRequest, reply: FakeReply) -> dict[str, Any]:
        """A real ``chat.completion`` object, as OpenAI sends it."""
        prompt = reply.prompt_tokens
        if prompt is None:
            prompt = sum(_words(m.get("content")) for m in request.messages)
        completion = reply.completion_tokens if reply.completion_tokens is not None else _words(reply.content)
        return {
            "id": f"chatcmpl-fake-{request.index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLLMServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet in tests
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(
                200, {"object": "list", "data": [{"id": self.fake.model, "object": "model", "owned_by": "fake"}]}
            )
        else:
            self._send(404, _error("not found", "not_found"))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, _error(f"no route {self.path}", "not_found"))
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, _error("request body is not JSON", "invalid_request_error"))
            return
        if body.get("stream"):
            self._send(400, _error("the fake LLM server does not stream", "invalid_request_error"))
            return
        try:
            request, reply = self.fake._record(self.path, self.headers.items(), body)
        except Exception as exc:  # a broken responder is a test bug: 400 fails the client at once
            self._send(400, _error(f"fake LLM responder raised {exc!r}", "invalid_request_error"))
            return
        if reply.delay and self.fake._stopping.wait(reply.delay):
            return
        if reply.body is not None:
            self._send(reply.status, reply.body, reply.headers)
        elif reply.status == 200:
            self._send(200, self.fake.completion_body(request, reply), reply.headers)
        else:
            kind = "rate_limit_error" if reply.status == 429 else "server_error"
            if 400 <= reply.status < 500 and reply.status != 429:
                kind = "invalid_request_error"
            self._send(reply.status, _error(reply.content or f"fake HTTP {reply.status}", kind), reply.headers)

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to tell it


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
