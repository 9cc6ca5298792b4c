"""Where a tool call runs (memrl_mcp/surface/calls.py): a call that waits for the store holds back no other client."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.storage import EdgeStore
from memrl_mcp.storage.quota import MeteredStore
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, make_service

pytestmark = pytest.mark.anyio

TASK = "Rotate the nginx logs every night and keep a week of them"
HELD_S = 20.0  # the longest the test holds the store's write lock when another call cannot get through


async def test_a_report_waiting_for_the_store_holds_back_no_other_client(embedder: Embedder, tmp_path: Path) -> None:
    """The server the HTTP transports serve (several clients): while the store's write lock is held, as a flush or
    the swap after a rebuild holds it, a report waits for it in a worker thread, and another client's read is
    answered meanwhile. Served on the event loop, the waiting report would hold back every request of the process
    until the lock was let go."""
    service = make_service(embedder, tmp_path / "data")
    metered = service._store  # the quota layer over the embedded store
    assert isinstance(metered, MeteredStore) and isinstance(metered._inner, EdgeStore), metered
    writing = metered._inner._writing  # the embedded store's write lock (a flush, a swap hold it)
    try:
        server = create_server(service)  # as the HTTP transports serve it
        async with Client(server) as alice, Client(server) as bob:
            await call(alice, "store_experience", task=TASK, experience="logrotate, daily, rotate 7")
            recall = await call(alice, "recall_experience", task=TASK)
            let_go = threading.Timer(HELD_S, writing.release)
            writing.acquire()
            let_go.start()
            answered_while_held: list[bool] = []
            with anyio.fail_after(2 * HELD_S):
                async with anyio.create_task_group() as group:
                    group.start_soon(lambda: call(alice, "report_outcome", recall_id=recall["recall_id"], reward=1.0))
                    await anyio.sleep(0.5)  # the report on its way to the lock (on the loop, this sleep would wait)
                    page = await call(bob, "list_memories")
                    answered_while_held.append(let_go.is_alive())
                    if let_go.is_alive():
                        let_go.cancel()
                        writing.release()
            assert [memory["task"] for memory in page["memories"]] == [TASK]
            assert answered_while_held == [True], "another client waited for the report's lock"
            assert (await call(bob, "memory_stats"))["visits"] == 1  # the report went through once the lock was free
    finally:
        service.close()
