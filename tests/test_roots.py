"""Per-project memory from MCP roots, through real MCP clients that offer roots (the handshake protocol, which
stdio and streamable-HTTP clients speak today)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.projects import project_namespace
from memrl_mcp.surface.calls import tool
from memrl_mcp.surface.server import create_server
from memrl_mcp.surface.tools import READS
from memrl_mcp.validation import NAMESPACE_PATTERN
from tests.support.mcp import call, make_service, read_json, refused
from tests.support.servers import DEADLINE_S, http_server

pytestmark = pytest.mark.anyio

TASK = "run the unit tests of this project"
ALPHA, OTHER_ALPHA = "file:///home/ann/code/alpha", "file:///home/ann/forks/alpha"
BETA = "file:///home/ann/code/beta"
OPS, TENANT = "ops-token-0123456789abc", "tenant-token-0123456789"


def offering(*uris: str) -> Any:
    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in uris])

    return list_roots


def test_the_project_namespace_is_readable_valid_and_distinct() -> None:
    alpha, other = project_namespace(ALPHA), project_namespace(OTHER_ALPHA)
    assert alpha.startswith("alpha-") and other.startswith("alpha-") and alpha != other
    odd = [
        "file:///home/ann/My%20Project%20(v2)",
        "file:///home/ann/proj%C3%A9t",
        "file:///",
        "file:///home/ann/" + "x" * 300,
        "file:///home/ann/%E4%BD%A0%E5%A5%BD",
        "file:///C:/Users/ann/app",
    ]
    names = [project_namespace(uri) for uri in odd]
    assert all(re.match(NAMESPACE_PATTERN, name) for name in names), names
    assert names[0].startswith("My-Project-v2-") and names[1].startswith("projet-") and names[4].startswith("project-")
    assert len(set(names)) == len(names)


@asynccontextmanager
async def project(service: MemoryService, *roots: str) -> AsyncIterator[Client]:
    """A client of its own connection (as each editor window is), offering ``roots`` if any."""
    callback = offering(*roots) if roots else None
    async with Client(create_server(service), list_roots_callback=callback, mode="legacy") as client:
        yield client


async def test_clients_with_different_roots_keep_their_memories_apart(service: MemoryService) -> None:
    async with (
        project(service, ALPHA) as alpha,
        project(service, OTHER_ALPHA) as other,
        project(service) as plain,
    ):
        mine = await call(alpha, "store_experience", task=TASK, experience="pytest -q")
        theirs = await call(other, "store_experience", task=TASK, experience="make check")
        default = await call(plain, "store_experience", task=TASK, experience="tox")
        assert mine["memory"]["namespace"] == project_namespace(ALPHA)
        assert theirs["memory"]["namespace"] == project_namespace(OTHER_ALPHA)
        assert default["memory"]["namespace"] == "default"  # a client without roots: the setting's namespace
        for client, expected in ((alpha, mine), (other, theirs), (plain, default)):
            listed = await call(client, "list_memories")
            assert [m["id"] for m in listed["memories"]] == [expected["id"]]
            recalled = await call(client, "recall_experience", task=TASK)
            assert [m["id"] for m in recalled["memories"]] == [expected["id"]]
            found = await call(client, "search_experience", task=TASK)
            assert [m["id"] for m in found["memories"]] == [expected["id"]]
        # The 2026-07-28 protocol (this SDK's in-process default) has no server-to-client request: the default.
        async with Client(create_server(service), list_roots_callback=offering(ALPHA)) as modern:
            assert (await call(modern, "list_memories"))["namespace"] == "default"
        # A project's session reaches its project's namespace alone (tests/test_claude_code.py performs the attack);
        # a client without a project names any.
        message = await refused(alpha, "store_experience", task=TASK, experience="nox", namespace="shared")
        assert "'shared' is not one of the namespaces a session of this project" in message
        assert "other_namespaces" in message
        shared = await call(plain, "store_experience", task=TASK, experience="nox", namespace="shared")
        assert shared["memory"]["namespace"] == "shared"


async def test_other_namespaces_widen_a_projects_reach_by_name(embedder: Embedder, tmp_path: Path) -> None:
    """A namespace a team shares is one setting away, and ["*"] gives a project's session every namespace."""
    for other, reaches in ((["team"], ("team",)), (["*"], ("team", "default", project_namespace(OTHER_ALPHA)))):
        service = make_service(embedder, tmp_path / other[0].replace("*", "all"), other_namespaces=other)
        try:
            async with project(service, ALPHA) as client:
                for namespace in reaches:
                    stored = await call(client, "store_experience", task=TASK, experience="tox", namespace=namespace)
                    assert stored["memory"]["namespace"] == namespace
                if other == ["team"]:
                    assert "not one of" in await refused(client, "list_memories", namespace="default")
        finally:
            service.close()


async def test_the_settings_can_pin_the_namespace_or_turn_roots_off(embedder: Embedder, tmp_path: Path) -> None:
    for overrides, expected in (({"namespace": "team"}, "team"), ({"namespace_from_roots": False}, "default")):
        service = make_service(embedder, tmp_path / str(expected), **overrides)
        try:
            async with project(service, ALPHA) as client:
                stored = await call(client, "store_experience", task=TASK, experience="pytest")
        finally:
            service.close()
        assert stored["memory"]["namespace"] == expected


@pytest.mark.slow  # a server process
async def test_a_restricted_token_keeps_its_restriction(tmp_path: Path) -> None:
    """Roots only pick a default, never a namespace a token may not use."""
    grants = [
        {"name": "ops", "token": OPS, "namespaces": ["*"]},
        {"name": "tenant", "token": TENANT, "namespaces": ["tenant"]},
    ]
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump({"tokens": grants}))

    @asynccontextmanager
    async def connect(url: str, token: str) -> AsyncIterator[Client]:
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
            transport = streamable_http_client(url, http_client=http)
            yield await stack.enter_async_context(Client(transport, list_roots_callback=offering(ALPHA), mode="legacy"))

    with (
        http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tmp_path / "tokens.yaml")) as server,
        anyio.fail_after(DEADLINE_S),
    ):
        async with connect(server.url, TENANT) as tenant, connect(server.url, OPS) as ops:
            held = await call(tenant, "store_experience", task=TASK, experience="pytest -x")
            assert held["memory"]["namespace"] == "tenant"  # the token's own, not the root's
            derived = project_namespace(ALPHA)
            message = await refused(tenant, "store_experience", task=TASK, experience="x", namespace=derived)
            assert "not one of the namespaces this token may use" in message
            # A token granting every namespace has no default of its own: the root's applies.
            opened = await call(ops, "store_experience", task=TASK, experience="pytest -q")
            assert opened["memory"]["namespace"] == derived
            steps = [{"observation": "$ ls", "action": "pytest -q", "reward": 1.0}]
            reported = await call(ops, "report_trajectory", task=TASK, steps=steps, episode_id="e")
            assert reported["namespace"] == derived
            assert (await call(ops, "recall_step_advice", task=TASK, observation="$ ls"))["namespace"] == derived
            assert (await call(tenant, "report_trajectory", task=TASK, steps=steps, episode_id="e"))["namespace"] == (
                "tenant"
            )
            assert (await call(tenant, "list_memories"))["total"] == 1
            assert "not one of the namespaces" in await refused(tenant, "list_memories", namespace=derived)
            stats = await read_json(tenant, "memrl://stats")
            assert stats["memories"] == 1


async def test_the_step_memory_keeps_projects_apart_too(service: MemoryService) -> None:
    """Issue 22, item 4: every tool resolves its default namespace in the same place, the step memory's too.
    Project alpha's trajectory is alpha's; project beta is never advised alpha's action."""
    login, page = "log in to the admin panel", "The admin login page shows a username and a password field."
    steps = [{"observation": page, "action": "type projA password", "reward": 1.0}]
    async with project(service, ALPHA) as alpha, project(service, BETA) as beta, project(service) as plain:
        reported = await call(alpha, "report_trajectory", task=login, steps=steps, episode_id="alpha-1")
        assert reported["namespace"] == project_namespace(ALPHA) and reported["created"] == 1
        advised = await call(alpha, "recall_step_advice", task=login, observation=page)
        assert [advice["action"] for advice in advised["encouraged"]] == ["type projA password"]
        for client, root in ((beta, BETA), (plain, None)):
            advice = await call(client, "recall_step_advice", task=login, observation=page)
            assert advice["namespace"] == (project_namespace(root) if root else "default")
            assert advice["encouraged"] == advice["discouraged"] == advice["records"] == []
        # The same episode id in another project is another episode.
        again = await call(beta, "report_trajectory", task=login, steps=steps, episode_id="alpha-1")
        assert again["namespace"] == project_namespace(BETA) and again["already_applied"] is False
        # A recall's report, and the episode memory it stores, stay in the recall's project.
        recall = await call(alpha, "recall_experience", task=login)
        report = await call(alpha, "report_outcome", recall_id=recall["recall_id"], reward=1.0, experience="pw")
        assert report["stored"]["memory"]["namespace"] == project_namespace(ALPHA)
        assert (await call(beta, "list_memories"))["total"] == 0


def test_a_tool_that_does_not_take_its_callers_access_cannot_be_served() -> None:
    """Every tool is served through one wrapper that resolves its caller; a tool body that would look its caller
    (or its default namespace) up by itself does not get past it."""

    def careless(task: str) -> dict[str, str]:
        return {"task": task}

    with pytest.raises(TypeError, match=r"the tool careless must take .* its caller's access"):
        tool({}, "Careless", READS)(careless)  # type: ignore[arg-type]  # a wrong tool, on purpose
