"""Abuse of the HTTP server by a client holding a valid token, through the real server process (issue 11).

A tenant that opens sessions without end must hit its own quota (429, naming the setting) while another tenant
still connects and works; sessions nobody uses close after ``session_idle_seconds``; ``/metrics`` (totals over
every tenant) needs a token once tokens exist.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.sse import sse_client

from tests.support.mcp import call
from tests.support.servers import (
    ALICE,
    BOB,
    DEADLINE_S,
    INITIALIZE,
    MCP_HEADERS,
    HttpServer,
    base_url,
    http_server,
    mcp_client,
    tokens_file,
)

pytestmark = pytest.mark.slow  # server processes

TASK = "Rotate the nginx logs every night and keep a week of them"
QUOTA, IDLE_S = 3, 2.0


def bearer(token: str) -> dict[str, str]:
    return {**MCP_HEADERS, "Authorization": f"Bearer {token}"}


async def open_session(http: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    """An ``initialize`` of protocol 2025-06-18 (most deployed clients): the request that opens a session."""
    return await http.post("/mcp", json=INITIALIZE, headers=headers)


async def ping(http: httpx.AsyncClient, session: str, headers: dict[str, str]) -> int:
    request = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    return (await http.post("/mcp", json=request, headers={**headers, "Mcp-Session-Id": session})).status_code


@pytest.mark.anyio
async def test_a_tenant_flooding_sessions_hits_its_own_quota_and_never_locks_out_another(tmp_path: Path) -> None:
    env = {
        "MEMRL_TOKENS_FILE": str(tokens_file(tmp_path)),
        "MEMRL_MAX_SESSIONS_PER_TOKEN": str(QUOTA),
        "MEMRL_SESSION_IDLE_SECONDS": str(IDLE_S * 100),  # no expiry during this test
    }
    with http_server(tmp_path / "data", tmp_path, **env) as server, anyio.fail_after(DEADLINE_S):
        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            opened = [await open_session(http, bearer(ALICE)) for _ in range(QUOTA)]
            assert [r.status_code for r in opened] == [200] * QUOTA
            sessions = [r.headers["mcp-session-id"] for r in opened]

            # The flood: 50 more, sequential and concurrent, are all refused with a message naming the setting.
            refusals: list[httpx.Response] = []
            for _ in range(10):
                refusals.append(await open_session(http, bearer(ALICE)))

            async def attempt() -> None:
                refusals.append(await open_session(http, bearer(ALICE)))

            async with anyio.create_task_group() as group:
                for _ in range(40):
                    group.start_soon(attempt)
            assert {r.status_code for r in refusals} == {429}
            error = refusals[0].json()["error"]["message"]
            assert f"too many open sessions for this token: {QUOTA} of max_sessions_per_token={QUOTA}" in error
            assert "mcp-session-id" not in refusals[0].headers

            # Bob is another tenant: he connects and works while alice is at her quota.
            async with mcp_client(server, BOB) as bob:
                stored = await call(bob, "store_experience", task=TASK, experience="logrotate daily, rotate 7")
                recall = await call(bob, "recall_experience", task=TASK)
                assert [m["id"] for m in recall["memories"]] == [stored["id"]]
            # Alice's open sessions still work, and ending one (DELETE) frees a place in her quota.
            assert await ping(http, sessions[0], bearer(ALICE)) == 200
            ended = await http.delete("/mcp", headers={**bearer(ALICE), "Mcp-Session-Id": sessions[0]})
            assert ended.status_code == 200
            assert (await open_session(http, bearer(ALICE))).status_code == 200
            assert (await open_session(http, bearer(ALICE))).status_code == 429

            # A bad token opens nothing and is not counted against anyone.
            assert (await open_session(http, bearer("not-a-token-at-all"))).status_code == 401


@pytest.mark.anyio
async def test_idle_sessions_close_and_give_their_place_back(tmp_path: Path) -> None:
    env = {
        "MEMRL_TOKENS_FILE": str(tokens_file(tmp_path)),
        "MEMRL_MAX_SESSIONS_PER_TOKEN": str(QUOTA),
        "MEMRL_SESSION_IDLE_SECONDS": str(IDLE_S),
    }
    with http_server(tmp_path / "data", tmp_path, **env) as server:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            sessions = [(await open_session(http, bearer(ALICE))).headers["mcp-session-id"] for _ in range(QUOTA)]
            assert (await open_session(http, bearer(ALICE))).status_code == 429
            await anyio.sleep(IDLE_S + 3)  # untouched: a request would restart the idle countdown
            assert [await ping(http, session, bearer(ALICE)) for session in sessions] == [404] * QUOTA
            reopened = [await open_session(http, bearer(ALICE)) for _ in range(QUOTA)]
            assert [r.status_code for r in reopened] == [200] * QUOTA


@pytest.mark.anyio
async def test_without_tokens_every_local_client_shares_one_quota(tmp_path: Path) -> None:
    env = {"MEMRL_MAX_SESSIONS_PER_TOKEN": "2", "MEMRL_SESSION_IDLE_SECONDS": "600"}
    with http_server(tmp_path / "data", tmp_path, **env) as server:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            statuses = [(await open_session(http, MCP_HEADERS)).status_code for _ in range(3)]
            assert statuses == [200, 200, 429]


@pytest.mark.anyio
async def test_metrics_need_a_token_once_tokens_exist(tmp_path: Path) -> None:
    with http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tokens_file(tmp_path))) as server:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            for headers in ({}, {"Authorization": "Bearer not-a-token-at-all"}, {"Authorization": f"Basic {ALICE}"}):
                response = await http.get("/metrics", headers=headers)
                assert response.status_code == 401, headers
                assert "memrl_memories" not in response.text
            scraped = await http.get("/metrics", headers={"Authorization": f"Bearer {ALICE}"})
            assert scraped.status_code == 200
            assert "memrl_memories 0.0" in scraped.text
    # Without tokens (a loopback-only server) the route stays open, as before.
    with http_server(tmp_path / "open", tmp_path) as server:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            assert (await http.get("/metrics")).status_code == 200


class SseStream:
    """A GET /sse on a socket of its own, held open until closed: its status, and the body of a refusal."""

    def __init__(self, port: int, token: str | None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        authorization = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{authorization}\r\n".encode())
        self._received = b""

    def status(self) -> int:
        while b"\r\n\r\n" not in self._received:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the stream before answering"
            self._received += chunk
        return int(self._received.split(b" ", 2)[1])

    def refusal(self) -> str:
        """The message of a 429 (its JSON-RPC error)."""
        head, _, body = self._received.partition(b"\r\n\r\n")
        found = re.search(rb"(?i)content-length: (\d+)", head)
        assert found is not None, head
        length = int(found[1])
        while len(body) < length:
            body += self.sock.recv(65536)
        return json.loads(body)["error"]["message"]

    def close(self) -> None:
        self.sock.close()


def sse_port(server: HttpServer) -> int:
    return int(base_url(server).rsplit(":", 1)[1])


def test_legacy_sse_streams_count_against_the_quota_too(tmp_path: Path) -> None:
    """Issue 22, item 5: a stream lives while its GET /sse is open, and counts like a session."""
    env = {"MEMRL_TOKENS_FILE": str(tokens_file(tmp_path)), "MEMRL_MAX_SESSIONS_PER_TOKEN": "2"}
    with http_server(tmp_path / "data", tmp_path, transport="sse", **env) as server:
        port = sse_port(server)
        held = [SseStream(port, ALICE) for _ in range(2)]
        assert [stream.status() for stream in held] == [200, 200]
        # The flood, all sent before any answer is read: every one refused, naming the setting.
        flood = [SseStream(port, ALICE) for _ in range(12)]
        assert {stream.status() for stream in flood} == {429}
        assert flood[0].refusal().startswith("too many open SSE streams for this token: 2 of max_sessions_per_token=2")
        for stream in flood:
            stream.close()
        # A bad token opens nothing and is not counted against anyone; bob has his own two, and works.
        assert SseStream(port, "not-a-token-at-all").status() == 401
        bobs = SseStream(port, BOB)
        assert bobs.status() == 200

        async def bob_works() -> None:
            with anyio.fail_after(DEADLINE_S):
                async with Client(sse_client(server.url, headers={"Authorization": f"Bearer {BOB}"})) as bob:
                    stored = await call(bob, "store_experience", task=TASK, experience="logrotate daily, rotate 7")
                    recall = await call(bob, "recall_experience", task=TASK)
                    assert [m["id"] for m in recall["memories"]] == [stored["id"]]
                    assert SseStream(port, BOB).status() == 429  # his third

        anyio.run(bob_works)
        bobs.close()
        # Closing one of alice's streams gives its place back (once the server has seen the disconnection).
        held.pop().close()
        deadline = time.monotonic() + DEADLINE_S
        while (reopened := SseStream(port, ALICE)).status() != 200:
            reopened.close()
            assert time.monotonic() < deadline, "a closed stream never gave its place back"
            time.sleep(0.05)
        assert SseStream(port, ALICE).status() == 429
        for stream in (*held, reopened):
            stream.close()
