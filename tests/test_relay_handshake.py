"""The relay answers the MCP handshake whatever becomes of the memory (issue 40.2 and 40.4): a session whose memory
cannot be reached completes its handshake, lists its tools and gets each call answered with the reason (a client
such as Claude Code drops a server that fails to connect for 15 minutes); a cold start lists the tools at once from
the server's last answers, and the store loads behind. Real stdio sessions of the Python SDK's client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.server import runner

from memrl_mcp.local.relay import HANDSHAKE_VERSIONS
from tests.support.local import LocalStore, local_store
from tests.support.mcp import call, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

START_S = 240


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    with local_store(tmp_path) as found:
        yield found


def test_the_relay_agrees_to_the_versions_the_server_speaks() -> None:
    assert runner.HANDSHAKE_PROTOCOL_VERSIONS == HANDSHAKE_VERSIONS
    assert HANDSHAKE_VERSIONS[-1] == runner.LATEST_HANDSHAKE_VERSION


async def test_a_memory_that_cannot_be_reached_still_completes_the_handshake(store: LocalStore) -> None:
    """The store held by a process of its own (``attach: false``): the attached session's server cannot start; the
    session is served all the same, and each call is answered with why."""
    with anyio.fail_after(START_S):
        async with Client(store.session(MEMRL_ATTACH="false")) as own:
            await call(own, "memory_stats")
            async with Client(store.session()) as attached:
                # the handshake was answered while the server was being started; the call waited for the attempt
                assert "memrl-mcp" in (attached.instructions or "")
                await attached.list_tools()
                result = await attached.call_tool("recall_experience", {"task": "deploy the web app"})
                assert result.is_error
                assert "already open in another process" in text_of(result), text_of(result)
                assert "memory (memrl-mcp) is unavailable" in text_of(result)


async def test_a_cold_start_lists_the_tools_at_once_and_then_serves_them(store: LocalStore) -> None:
    with anyio.fail_after(START_S):
        async with Client(store.session()) as first:  # its server's answers are kept
            await call(first, "store_experience", task="tune the piano", experience="every spring")
            tools = {tool.name for tool in (await first.list_tools()).tools}  # the first ever: the server's own
        assert store.local("stop").returncode == 0
        store.wait_gone()
        async with Client(store.session()) as cold:  # how soon: perf/cold_start.py
            listed = await cold.list_tools()
            assert {tool.name for tool in listed.tools} == tools and len(tools) == 11
            recalled = await call(cold, "recall_experience", task="tune the piano")
            assert "every spring" in str(recalled), recalled
