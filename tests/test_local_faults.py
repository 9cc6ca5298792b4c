"""The local memory server's faults, performed: its owner SIGKILLed mid-write and between calls, the leftovers of a
crash, the idle exit, another version or other settings of the memory meeting a running server, and the old one
process per session. Real stdio sessions of the Python SDK's client, real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.shared.exceptions import MCPError

import memrl_mcp
from memrl_mcp.local.place import OWNER_LOCK, START_LOCK, flocked
from memrl_mcp.projects import project_namespace
from tests.support.local import LocalStore, RawSession, local_store, servers_of
from tests.support.mcp import call, resource_text
from tests.support.servers import run_cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # every test starts and kills servers

START_S = 240
WORDS = [
    *("amber", "basalt", "cobalt", "dune", "ember", "fjord", "glacier", "harbor", "iris", "juniper", "kelp", "lagoon"),
    *("meadow", "nectar", "orchid", "prairie", "quartz", "reef", "saffron", "tundra", "umber", "valley", "willow"),
]
ROOT = "file:///home/ann/code/gamma"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    with local_store(tmp_path) as found:
        yield found


@asynccontextmanager
async def session(store: LocalStore, **options: Any) -> AsyncIterator[Client]:
    variables = options.pop("env", {})
    async with Client(store.session(**variables), **options) as client:
        yield client


async def refusal(store: LocalStore, **variables: str) -> str:
    """Why a session with ``variables`` is refused: the handshake completes (a client drops a server whose
    handshake fails), its instructions and each call's tool error say why."""
    async with session(store, env=variables) as refused:
        result = await refused.call_tool("memory_stats", {})
        assert result.is_error, result
        reason = " ".join(getattr(block, "text", "") for block in result.content)
        assert reason in (refused.instructions or ""), (reason, refused.instructions)
        return reason


def task_of(writer: int, index: int) -> str:
    """Tasks far apart from each other, so that no two merge into one memory."""
    words = [WORDS[(writer * 7 + index * step) % len(WORDS)] for step in (1, 3, 5, 11)]
    return f"writer {writer} task {index}: {' '.join(words)} {index * 7919 + writer}"


async def every_memory_id(client: Client) -> set[str]:
    ids, cursor = set(), None
    while True:
        page = await call(client, "list_memories", limit=100, **({"cursor": cursor} if cursor else {}))
        ids |= {memory["id"] for memory in page["memories"]}
        cursor = page.get("next_cursor")
        if not cursor:
            return ids


async def test_a_sigkill_of_the_owner_mid_write_loses_no_acknowledged_write(store: LocalStore) -> None:
    """Three sessions store memories without pause; the owner is SIGKILLed while they do. A call in flight fails
    once, clearly; the next ones reach a new server started for them; every acknowledged write is there. On a busy
    machine the three sessions' calls may all be answered at the moment of the kill (the server is then waiting
    for them): the new owner is killed in turn, up to :data:`KILLS` times, until the kill meets a call in flight."""
    acknowledged: set[str] = set()
    failures: list[str] = []
    killed = anyio.Event()
    kills = 0

    async def killer() -> None:
        nonlocal kills
        while not failures and kills < KILLS:
            seen = len(acknowledged)
            while len(acknowledged) < seen + 3:
                await anyio.sleep(0.01)
            owner = await anyio.to_thread.run_sync(store.server_pid)  # asked while the writers go on
            while len(acknowledged) < seen + 15:
                await anyio.sleep(0.001)
            os.kill(owner, signal.SIGKILL)  # at once: the three sessions' next calls are in flight, most often
            kills += 1
            while not failures and len(acknowledged) < seen + 21:  # the writers reach the new server
                await anyio.sleep(0.01)
        killed.set()

    with anyio.fail_after(START_S * KILLS):
        async with anyio.create_task_group() as group:
            group.start_soon(killer)
            for number in range(3):
                group.start_soon(resilient_writer, store, number, killed, acknowledged, failures)
    assert failures, f"no call was in flight when the owner died, in {kills} kills"
    assert all("may or may not have been applied" in failure for failure in failures), failures
    assert len(failures) <= 3  # at most the one call each session had in flight
    async with session(store) as client:
        assert acknowledged <= await every_memory_id(client)


KILLS = 4  # owners killed at most, until one kill meets a call in flight
AFTER_THE_KILL = 5  # calls each session makes once the owner was killed: they reach the new server


async def resilient_writer(
    store: LocalStore, number: int, killed: anyio.Event, acknowledged: set[str], failures: list[str]
) -> None:
    """One session storing memories in a row until :data:`AFTER_THE_KILL` calls after ``killed``; a call that fails
    (the owner died under it) is counted and the session goes on with its next call, as an agent would."""
    async with session(store) as client:
        done, after = 0, 0
        while after < AFTER_THE_KILL:
            arguments = {"task": task_of(number, done), "experience": f"lesson {number}-{done}"}
            try:
                result = await call(client, "store_experience", **arguments)
            except MCPError as error:
                failures.append(str(error))
            else:
                acknowledged.add(result["id"])
            done += 1
            after += killed.is_set()


async def test_a_sigkill_between_calls_is_not_seen_by_the_session(store: LocalStore) -> None:
    """The owner dies while the session is idle: the next call starts a new owner and answers, with the session's
    handshake replayed to it (its roots still give its project namespace)."""
    roots = [types.Root(uri=ROOT)]

    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=roots)

    with anyio.fail_after(START_S):
        async with session(store, list_roots_callback=list_roots, mode="legacy") as client:
            first = await call(client, "store_experience", task="back up the photos", experience="rsync nightly")
            owner = store.server_pid()
            os.kill(owner, signal.SIGKILL)
            await anyio.to_thread.run_sync(store.wait_gone)
            second = await call(client, "store_experience", task="clean the gutters", experience="in autumn")
            assert store.server_pid() != owner
            assert first["memory"]["namespace"] == second["memory"]["namespace"] == project_namespace(ROOT)
            found = await call(client, "list_memories", namespace=project_namespace(ROOT))
            assert {m["task"] for m in found["memories"]} == {"back up the photos", "clean the gutters"}


async def test_leftovers_of_crashes_never_block_a_start(store: LocalStore) -> None:
    """A socket file nobody listens on, the lock files, a temporary socket of a dead server and its log: the next
    session starts a server and is served; so after a real SIGKILL of the owner."""
    place = store.place
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(os.fspath(place.socket))  # bound and never listened on: a connection is refused, as to a dead server
    dead.close()
    for lock in (OWNER_LOCK, START_LOCK):
        with flocked(place, lock) as held:
            assert held
    (place.folder / "socket.999999").write_text("")
    place.log.write_text("an old server's last words\n")
    with anyio.fail_after(START_S):
        async with session(store) as client:
            await call(client, "store_experience", task="feed the cat", experience="twice a day")
            owner = store.server_pid()
        os.kill(owner, signal.SIGKILL)
        await anyio.to_thread.run_sync(store.wait_gone)
        assert place.socket.exists()  # what the killed owner left
        async with session(store) as client:
            page = await call(client, "list_memories")
            assert [m["task"] for m in page["memories"]] == ["feed the cat"]


async def test_the_server_outlives_its_sessions_then_exits_when_idle(store: LocalStore) -> None:
    with anyio.fail_after(START_S):
        async with session(store, env={"MEMRL_LOCAL_IDLE_SECONDS": "2"}) as client:
            await call(client, "store_experience", task="walk the dog", experience="at seven")
            await anyio.sleep(3)  # longer than the idle time: a session is attached, the server stays
            assert (await call(client, "memory_stats"))["memories"] == 1
            owner = store.server_pid()
        assert store.status() is not None  # it outlives the session ...
        await anyio.to_thread.run_sync(lambda: store.wait_gone(timeout=20))  # ... and leaves on its own
        while servers_of(store.runtime_dir):
            await anyio.sleep(0.05)
    assert not store.place.socket.exists()
    assert owner not in servers_of(store.runtime_dir)


def older_copy(tmp_path: Path) -> Path:
    """This package copied under ``tmp_path`` as version 0.0.1: another installed version of memrl-mcp."""
    root = tmp_path / "older"
    shutil.copytree(Path(memrl_mcp.__file__).parent, root / "memrl_mcp", ignore=shutil.ignore_patterns("__pycache__"))
    init = root / "memrl_mcp" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{memrl_mcp.__version__}"', '__version__ = "0.0.1"'))
    return root


async def test_another_version_restarts_an_idle_server_and_is_refused_beside_sessions(
    store: LocalStore, tmp_path: Path
) -> None:
    older = {"PYTHONPATH": str(older_copy(tmp_path))}
    with anyio.fail_after(START_S):
        async with session(store, env=older) as old:
            await call(old, "store_experience", task="tune the piano", experience="every spring")
            old_owner = store.server_pid()
            message = await refusal(store)
            assert "0.0.1" in message and memrl_mcp.__version__ in message and "1 other session" in message
            assert (await call(old, "memory_stats"))["memories"] == 1  # the running session is untouched
        async with session(store) as new:  # the old server serves nobody now: it makes way
            assert [m["task"] for m in (await call(new, "list_memories"))["memories"]] == ["tune the piano"]
            assert store.server_pid() != old_owner
            assert (store.status() or pytest.fail("no server")).version == memrl_mcp.__version__


async def test_other_settings_of_the_memory_are_refused_beside_sessions_and_restart_an_idle_server(
    store: LocalStore,
) -> None:
    with anyio.fail_after(START_S):
        async with session(store) as first:
            await call(first, "memory_stats")  # the handshake waits for no server: a call reaches it
            owner = store.server_pid()
            assert "k1 (the session's from environment MEMRL_K1)" in await refusal(store, MEMRL_K1="3")
            async with session(store, env={"MEMRL_NAMESPACE": "elsewhere"}) as second:  # a session's own setting
                await call(second, "memory_stats")
            await call(first, "memory_stats")
        async with session(store, env={"MEMRL_K1": "3"}) as third:
            settings = await third.read_resource("memrl://settings")
            assert '"k1":3' in resource_text(settings).replace(" ", "")
            assert store.server_pid() != owner


async def test_one_process_per_session_stays_available(store: LocalStore) -> None:
    """``--no-attach`` (or attach: false) opens the store in the session's own process, as before: no local server
    starts; and beside a local server holding the store, such a process says what holds it."""
    with anyio.fail_after(START_S):
        async with session(store, env={"MEMRL_ATTACH": "false"}) as own:
            await call(own, "store_experience", task="paint the fence", experience="two coats")
            assert servers_of(store.runtime_dir) == []
        async with session(store) as attached:
            await call(attached, "memory_stats")
            refused = await anyio.to_thread.run_sync(lambda: run_cli("--no-attach", env=store.env()))
    assert refused.returncode == 2
    assert "already open in another process" in refused.stderr and "memrl-mcp local stop" in refused.stderr


def is_question(message: dict[str, Any]) -> bool:
    return message.get("method") == "elicitation/create"


async def test_a_late_answer_to_a_dead_servers_question_reaches_no_other_question(store: LocalStore) -> None:
    """A report asks the user (elicitation) and the owner is SIGKILLed while the question is open; the next report
    asks a new server, whose own question counts its ids from the start again. The user's late answer to the first
    question (a failure) must not settle the second: it is the second's own answer (a success) that applies, and
    the first question is withdrawn in the client (``notifications/cancelled``) when its server dies."""

    def scenario() -> None:
        session = RawSession(store)
        try:
            session.initialize(elicitation={})
            first = asked_by_a_report(session, "sweep the chimney", 1)
            os.kill(store.server_pid(), signal.SIGKILL)
            lost = session.wait(lambda message: message.get("id") == first["report"] and "method" not in message)
            assert "may or may not have been applied" in lost["error"]["message"], lost
            second = asked_by_a_report(session, "oil the bicycle chain", 2)
            assert "oil the bicycle chain" in second["question"]["params"]["message"]
            late = {"action": "accept", "content": {"succeeded": False}}  # the user's answer to the first question
            session.send({"jsonrpc": "2.0", "id": first["question"]["id"], "result": late})
            own = {"action": "accept", "content": {"succeeded": True}}
            session.send({"jsonrpc": "2.0", "id": second["question"]["id"], "result": own})
            answer = session.wait(lambda message: message.get("id") == second["report"] and "method" not in message)
            report = answer["result"]["structuredContent"]
            assert (report["reward"], report["reward_source"]) == (1.0, "user"), report
            read = session.request("resources/read", {"uri": f"memrl://recalls/{first['recall']}"})
            assert json.loads(read["result"]["contents"][0]["text"])["status"] == "pending"  # nor to its own recall
            withdrawn = [m["params"]["requestId"] for m in session.seen if m.get("method") == "notifications/cancelled"]
            assert withdrawn == [first["question"]["id"]]
        finally:
            session.close()

    with anyio.fail_after(START_S):
        await anyio.to_thread.run_sync(scenario)


def asked_by_a_report(session: RawSession, task: str, round_: int) -> dict[str, Any]:
    """Store ``task``, recall it and report without a reward: the server asks the user. The recall id, the report's
    request id and the question."""
    session.call("store_experience", task=task, experience=f"how to {task}")
    recall = session.call("recall_experience", task=task)["result"]["structuredContent"]["recall_id"]
    report = 100 + round_
    arguments = {"recall_id": recall, "experience": "it worked"}
    session.ask(report, "tools/call", {"name": "report_outcome", "arguments": arguments})
    question = session.wait(lambda message: is_question(message) and task in message["params"]["message"])
    return {"recall": recall, "report": report, "question": question}
