"""Identity per request (issue 22, item 1): on one kept-alive HTTP/1.1 connection, no request is ever served as
the tenant of an earlier one.

The attack, through the real server process on both HTTP transports: alice's client sends an ordinary
``report_trajectory`` of about 200 KB (a body larger than uvicorn's 64 KB flow-control mark); then, on the very
same connection (as a reverse proxy pooling upstream connections would send them), requests with no token, a wrong
token, alice's token as a Basic credential, and bob's token go to every route that serves tenant data. A second
trigger needs no large body at all: HTTP/1.1 pipelining. Every request must be refused (401/404) or, for bob, see
bob's data only; alice's memory must be untouched. See docs/security.md, "Identity per request".
"""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, StatsQuery
from memrl_mcp.settings import TokenGrant
from memrl_mcp.surface.auth import TokenTable
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, refused
from tests.support.servers import (
    ALICE,
    BOB,
    DEADLINE_S,
    INITIALIZE,
    MCP_HEADERS,
    TOOLS,
    HttpServer,
    base_url,
    http_server,
    mcp_client,
    tokens_file,
)

ALICE_TASK = "Rotate the database credentials of the payroll service"
ALICE_SECRET = "the vault path is secret/payroll/db, rotate with vault write -f"
BOB_TASK = "Water the office plants on Fridays"
STRANGERS = {
    "no token": {},
    "a wrong token": {"Authorization": "Bearer not-a-token-at-all-0123"},
    "alice's token as Basic": {"Authorization": f"Basic {ALICE}"},
}
JSON_BODY = {"Content-Type": "application/json"}
STATS_CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "memory_stats", "arguments": {}}}

pytestmark = pytest.mark.anyio


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def big_trajectory() -> list[dict[str, Any]]:
    """A shell session of 25 steps, each a long listing (~6,900 characters) and a command (~900): about 200 KB
    of JSON, far above uvicorn's 64 KB flow-control mark."""
    listing = "".join(f"-rw-r----- 1 payroll payroll {n:>6} Jan 03:00 credentials-{n}.conf\n" for n in range(110))
    return [
        {
            "observation": f"$ ls -l /etc/payroll/{i}\n" + listing[:6900],
            "action": f"sed -i 's/old/new/' /etc/payroll/{i}/*.conf && " + "systemctl reload payroll && " * 30,
            "reward": 1.0 if i == 24 else 0.0,
        }
        for i in range(25)
    ]


@dataclass
class RawSession:
    """An MCP session spoken in raw JSON-RPC. ``send`` posts a request and returns its id, ``answer`` waits for
    the answer to it (apart, so that other requests can be sent in between); ``address`` is where its messages
    go (the Mcp-Session-Id of streamable HTTP, the message endpoint of SSE)."""

    send: Callable[[str, dict[str, Any]], Awaitable[int]]
    answer: Callable[[int], Awaitable[dict[str, Any]]]
    address: str

    async def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self.answer(await self.send(method, params))


@dataclass
class Tenants:
    server: HttpServer
    transport: str
    alice_memory: str
    bob_memory: str


@pytest.fixture(scope="module", params=["streamable-http", "sse"])
def tenants(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    """One server per transport, alice's secret and bob's memory in it."""
    tmp = tmp_path_factory.mktemp(request.param)
    with http_server(tmp / "data", tmp, transport=request.param, MEMRL_TOKENS_FILE=str(tokens_file(tmp))) as server:

        async def seed() -> tuple[str, str]:
            async with mcp_client(server, ALICE) as alice, mcp_client(server, BOB) as bob:
                mine = await call(alice, "store_experience", task=ALICE_TASK, experience=ALICE_SECRET)
                theirs = await call(bob, "store_experience", task=BOB_TASK, experience="a litre each")
            return mine["id"], theirs["id"]

        if request.param == "sse":  # the SDK's streamable-HTTP client cannot seed an SSE server: raw JSON-RPC
            alice_memory, bob_memory = anyio.run(seed_over_sse, server)
        else:
            alice_memory, bob_memory = anyio.run(seed)
        yield Tenants(server, request.param, alice_memory, bob_memory)


async def seed_over_sse(server: HttpServer) -> tuple[str, str]:
    base = base_url(server)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        ids = []
        for token, task in ((ALICE, ALICE_TASK), (BOB, BOB_TASK)):
            async with sse_session(base, http, token) as session:
                experience = ALICE_SECRET if token == ALICE else "a litre each"
                ids.append(await tool(session, "store_experience", task=task, experience=experience))
        return ids[0]["id"], ids[1]["id"]


# -- raw MCP sessions over one shared httpx connection -----------------------------------------------


_ids = itertools.count(100)


@asynccontextmanager
async def streamable_session(http: httpx.AsyncClient, token: str) -> AsyncIterator[RawSession]:
    """An MCP session whose every request goes over ``http`` (JSON answers: the server's json_response)."""
    opened = await http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **bearer(token)})
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    headers = {**MCP_HEADERS, **bearer(token), "Mcp-Session-Id": session}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post("/mcp", json=initialized, headers=headers)).status_code == 202
    answers: dict[int, dict[str, Any]] = {}

    async def send(method: str, params: dict[str, Any]) -> int:
        request_id = next(_ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        answer = await http.post("/mcp", json=message, headers=headers)
        assert answer.status_code == 200, answer.text
        answers[request_id] = answer.json()
        return request_id

    async def answer(request_id: int) -> dict[str, Any]:
        return answers.pop(request_id)

    yield RawSession(send, answer, session)


@asynccontextmanager
async def sse_session(base: str, http: httpx.AsyncClient, token: str) -> AsyncIterator[RawSession]:
    """An MCP session over the legacy SSE transport: the stream is a GET on a connection of its own, every
    message is POSTed over ``http``."""
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as streaming,
        streaming.stream("GET", "/sse", headers=bearer(token)) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.aiter_lines()

        async def event() -> tuple[str, str]:
            kind = "message"
            data: list[str] = []
            async for line in lines:
                if not line:
                    if data:
                        return kind, "\n".join(data)
                    continue
                field, _, value = line.partition(":")
                if field == "event":
                    kind = value.strip()
                elif field == "data":
                    data.append(value.removeprefix(" "))
            raise EOFError("the SSE stream ended")

        kind, endpoint = await event()
        assert kind == "endpoint"

        async def post(message: dict[str, Any]) -> None:
            posted = await http.post(endpoint, json=message, headers={**JSON_BODY, **bearer(token)})
            assert posted.status_code == 202, posted.text

        async def send(method: str, params: dict[str, Any]) -> int:
            request_id = next(_ids)
            await post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return request_id

        async def answer(request_id: int) -> dict[str, Any]:
            while True:
                message = json.loads((await event())[1])
                if message.get("id") == request_id:
                    return message

        session = RawSession(send, answer, endpoint)
        await session.rpc("initialize", INITIALIZE["params"])
        await post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield session


async def tool(session: RawSession, name: str, **arguments: Any) -> dict[str, Any]:
    answer = await session.rpc("tools/call", {"name": name, "arguments": arguments})
    result = answer["result"]
    assert not result.get("isError"), result
    return result["structuredContent"]


# -- the attack --------------------------------------------------------------------------------------


async def probe_every_route(http: httpx.AsyncClient, tenants: Tenants) -> None:
    """Every route serving tenant data, as a stranger (refused) and as bob (his own data only)."""
    alice_memory, bob_memory = tenants.alice_memory, tenants.bob_memory
    routes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/stats", None),
        ("GET", "/metrics", None),
        ("GET", "/ui/api/session", None),
        ("GET", "/ui/api/stats", None),
        ("GET", "/ui/api/memories", None),
        ("GET", f"/ui/api/memories/{alice_memory}", None),
        ("PATCH", f"/ui/api/memories/{alice_memory}", {"experience": "overwritten by a stranger"}),
        ("DELETE", f"/ui/api/memories/{alice_memory}", {}),
        ("POST", "/ui/api/preview", {"task": ALICE_TASK}),
        ("GET", "/ui/api/curves", None),
    ]
    for who, headers in STRANGERS.items():
        for method, path, body in routes:
            response = await http.request(method, path, json=body, headers={**JSON_BODY, **headers})
            assert response.status_code == 401, (who, method, path, response.text[:200])
            assert ALICE_SECRET not in response.text

    answers = {}
    for method, path, body in routes:
        response = await http.request(method, path, json=body, headers={**JSON_BODY, **bearer(BOB)})
        assert ALICE_SECRET not in response.text, (method, path)
        answers[method, path] = response
    assert answers["GET", "/stats"].json()["memories"] == 1
    assert answers["GET", "/metrics"].status_code == 200
    assert answers["GET", "/ui/api/session"].json()["namespaces"] == ["bob", "shared"]
    assert answers["GET", "/ui/api/stats"].json()["memories"] == 1
    assert [m["id"] for m in answers["GET", "/ui/api/memories"].json()["memories"]] == [bob_memory]
    for method in ("GET", "PATCH", "DELETE"):
        refused = answers[method, f"/ui/api/memories/{alice_memory}"]
        assert refused.status_code == 400 and refused.json()["error_description"].startswith("memory_id: no memory")
    assert {c["id"] for c in answers["POST", "/ui/api/preview"].json()["candidates"]} <= {bob_memory}
    assert answers["GET", "/ui/api/curves"].status_code == 200


def local_port(response: httpx.Response) -> int:
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


@pytest.mark.slow  # the module's server processes
async def test_a_large_authenticated_body_lends_its_identity_to_no_later_request(tenants: Tenants) -> None:
    base = base_url(tenants.server)
    ports: set[int] = set()

    async def note(response: httpx.Response) -> None:
        ports.add(local_port(response))

    # One HTTP/1.1 connection, kept alive, carries every request but the SSE streams (checked by its local port).
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    hooks = {"response": [note]}
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits, event_hooks=hooks) as http:
        with anyio.fail_after(DEADLINE_S * 2):
            if tenants.transport == "sse":
                async with sse_session(base, http, ALICE) as alice, sse_session(base, http, BOB) as bob:
                    await attack_and_probe(http, tenants, alice, bob)
                    for headers in STRANGERS.values():
                        assert (await http.get("/sse", headers=headers)).status_code == 401
                        refused = await http.post(alice.address, json=STATS_CALL, headers={**JSON_BODY, **headers})
                        assert refused.status_code == 401
                    # alice's session, addressed by bob: as if it did not exist.
                    as_bob = await http.post(alice.address, json=STATS_CALL, headers={**JSON_BODY, **bearer(BOB)})
                    assert as_bob.status_code == 404
            else:
                async with streamable_session(http, ALICE) as alice, streamable_session(http, BOB) as bob:
                    await attack_and_probe(http, tenants, alice, bob)
                    for headers in STRANGERS.values():
                        opening = await http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **headers})
                        assert opening.status_code == 401
                        in_alices = {**MCP_HEADERS, **headers, "Mcp-Session-Id": alice.address}
                        assert (await http.post("/mcp", json=STATS_CALL, headers=in_alices)).status_code == 401
                    bob_in_alices = {**MCP_HEADERS, **bearer(BOB), "Mcp-Session-Id": alice.address}
                    assert (await http.post("/mcp", json=STATS_CALL, headers=bob_in_alices)).status_code == 404
            kept = await http.get(f"/ui/api/memories/{tenants.alice_memory}", headers=bearer(ALICE))
            assert kept.status_code == 200 and kept.json()["experience"] == ALICE_SECRET
    assert len(ports) == 1


async def attack_and_probe(http: httpx.AsyncClient, tenants: Tenants, alice: RawSession, bob: RawSession) -> None:
    steps = big_trajectory()
    assert len(json.dumps(steps)) > 190_000
    arguments = {"task": ALICE_TASK, "steps": steps, "episode_id": "big-one"}
    reporting = await alice.send("tools/call", {"name": "report_trajectory", "arguments": arguments})

    await probe_every_route(http, tenants)
    reported = (await alice.answer(reporting))["result"]["structuredContent"]
    assert reported["namespace"] == "alice"

    # MCP tools and resources, called by bob over the same connection, see bob's namespaces only.
    assert (await tool(bob, "memory_stats"))["memories"] == 1
    listed = await tool(bob, "list_memories")
    assert [m["id"] for m in listed["memories"]] == [tenants.bob_memory]
    found = await tool(bob, "search_experience", task=ALICE_TASK)
    assert tenants.alice_memory not in [m["id"] for m in found["memories"]]
    advice = await tool(bob, "recall_step_advice", task=ALICE_TASK, observation=steps[0]["observation"])
    assert advice["namespace"] == "bob" and advice["encouraged"] == [] and advice["discouraged"] == []
    read = await bob.rpc("resources/read", {"uri": "memrl://stats"})
    assert json.loads(read["result"]["contents"][0]["text"])["memories"] == 1
    # And alice, after all that, is still alice.
    assert (await tool(alice, "memory_stats"))["memories"] == 1


def pipelined(port: int, requests: list[tuple[str, str, dict[str, str]]]) -> list[tuple[int, bytes]]:
    """Send every request at once on one socket (HTTP/1.1 pipelining), read the answers in order."""
    wire = b""
    for method, path, headers in requests:
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
        wire += ("\r\n".join(lines) + "\r\n\r\n").encode()
    answers: list[tuple[int, bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(wire)
        received = b""
        while len(answers) < len(requests):
            head, separator, rest = received.partition(b"\r\n\r\n")
            if separator:
                fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                length = int(fields[b"content-length"])
                if len(rest) >= length:
                    answers.append((int(head.split(b" ")[1]), rest[:length]))
                    received = rest[length:]
                    continue
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {len(answers)} answers"
            received += chunk
    return answers


@pytest.mark.slow  # the module's server processes
def test_pipelined_requests_do_not_inherit_the_first_ones_identity(tenants: Tenants) -> None:
    """No large body needed: a second request pipelined behind an authenticated one is parsed while the first
    one's answer is being sent."""
    port = int(base_url(tenants.server).rsplit(":", 1)[1])
    requests = [("GET", "/ui/api/session", bearer(ALICE))]
    for headers in STRANGERS.values():
        requests += [("GET", "/ui/api/session", headers), ("GET", "/stats", headers), ("GET", "/metrics", headers)]
        requests.append(("GET", f"/ui/api/memories/{tenants.alice_memory}", headers))
    requests.append(("GET", "/ui/api/memories", bearer(BOB)))
    answers = pipelined(port, requests)
    assert answers[0][0] == 200 and json.loads(answers[0][1])["namespaces"] == ["alice"]
    assert [status for status, _ in answers[1:-1]] == [401] * (len(requests) - 2)
    assert all(ALICE_SECRET.encode() not in body for _, body in answers[1:])
    status, body = answers[-1]
    assert status == 200 and [m["id"] for m in json.loads(body)["memories"]] == [tenants.bob_memory]


async def test_a_server_with_tokens_serves_no_call_that_carries_none(service: MemoryService) -> None:
    """Every tool and resource takes its caller from the request that carried the call, through one function:
    called where there is no request (an in-process client) on a server that requires tokens, each one refuses.
    A tool that looked its caller up anywhere else would answer here."""
    memory = service.store_experience(NewExperience(ALICE_TASK, ALICE_SECRET, namespace="alice"), access=EVERYTHING).id
    valid_calls: dict[str, dict[str, Any]] = {
        "recall_experience": {"task": ALICE_TASK},
        "search_experience": {"task": ALICE_TASK},
        "report_outcome": {"recall_id": "0" * 36, "reward": 1.0},
        "store_experience": {"task": ALICE_TASK, "experience": "x"},
        "recall_step_advice": {"task": ALICE_TASK, "observation": "$ ls"},
        "report_trajectory": {"task": ALICE_TASK, "steps": big_trajectory()[:1], "episode_id": "e"},
        "forget_experience": {"memory_id": memory},
        "memory_stats": {},
        "list_memories": {},
        "update_memory": {"memory_id": memory, "experience": "overwritten"},
        "record_evidence": {"recall_id": "0" * 36, "checks": [{"kind": "edit"}]},
    }
    grants = [TokenGrant(name="alice", token=ALICE, namespaces=["alice"])]
    async with Client(create_server(service, TokenTable(grants))) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == set(valid_calls) == TOOLS
        for name, arguments in valid_calls.items():
            message = await refused(client, name, **arguments)
            assert message.endswith("authorization: a valid bearer token is required"), (name, message)
        for uri in (
            "memrl://stats",
            "memrl://stats/alice",
            f"memrl://memories/{memory}",
            f"memrl://recalls/{'0' * 36}",
        ):
            with pytest.raises(Exception, match="authorization: a valid bearer token is required"):
                await client.read_resource(uri)
    assert service.get(memory, access=EVERYTHING).experience == ALICE_SECRET
    assert service.stats(StatsQuery(), access=EVERYTHING).memories == 1
