"""What every fake model API of the tests shares: the model's turn (:class:`Reply`), the model itself (a
:data:`Script`), and a loopback HTTP server that keeps each request the agent makes and answers it in the API's own
form (:func:`serve`). The model is the one part of an agent's session that cannot run here; each API's module
(:mod:`tests.support.anthropic`, :mod:`tests.support.openai_responses`, :mod:`tests.support.chat_completions`) says
only how its API carries a reply."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """The model's turn: ``text``, then a call of ``tool`` with ``arguments`` when one is named."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] | None = None


Script = Callable[[dict[str, Any]], Reply]
"""The model: a request's body (its messages or input, its tools) -> its reply."""


@dataclass
class FakeModel:
    url: str
    requests: list[dict[str, Any]]


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its content type and body; ``kept``: the request is one of the model's (not a count of
    tokens, a list of models)."""

    kind: str
    body: bytes
    kept: bool = True


def sse(events: list[tuple[str | None, Any]]) -> Answer:
    """A stream of server-sent events, each ``(event name or None, data)``; data that is not a string is JSON."""
    text = "".join(
        (f"event: {name}\n" if name else "") + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
        for name, data in events
    )
    return Answer("text/event-stream", text.encode())


def whole(data: Any, kept: bool = True) -> Answer:
    return Answer("application/json", json.dumps(data).encode(), kept)


Route = Callable[[str, dict[str, Any]], Answer]
"""An API: a POST's path and JSON body -> the answer."""


@contextmanager
def serve(route: Route, listing: Any = None) -> Iterator[FakeModel]:
    """``route`` on a free loopback port while the context lasts; the bodies of the requests it keeps are in
    ``requests``. A GET is answered ``listing`` (the API's list of models), or 404 without one."""
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if listing is None:
                self.send_error(404)
                return
            self._send(whole(listing, kept=False))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            answer = route(self.path, body)
            if answer.kept:
                requests.append(body)
            self._send(answer)

        def _send(self, answer: Answer) -> None:
            self.send_response(200)
            self.send_header("content-type", answer.kind)
            self.send_header("content-length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeModel(f"http://127.0.0.1:{server.server_address[1]}", requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
