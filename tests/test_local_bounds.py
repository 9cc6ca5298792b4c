"""A shared server no session can exhaust, performed against a real local server process: a message of 300 MB, a
greeting dripped a byte at a time, a thousand silent connections, more sessions than the server serves, hundreds of
project folders one after another, and a flood of writes beside another session's recalls. What each may take is
read from the kernel's account of the server (``/proc/PID/status``: ``VmHWM``, the peak of its resident memory,
and ``Threads``), never from the server's own word."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memrl_mcp.local.attach import attach, connect_socket
from memrl_mcp.local.client import LocalClient
from memrl_mcp.local.greeting import encode
from memrl_mcp.local.place import AttachError
from memrl_mcp.local.server import GREETING_SECONDS, UNGREETED
from memrl_mcp.settings.serving import ServingSettings
from tests.support.local import LocalStore, Wire, local_store, proc_status

pytestmark = pytest.mark.slow  # every test runs a local server process

MB = 1 << 20
TASK = "rotate the credentials of the staging database"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    with local_store(tmp_path) as found:
        yield found


def started(store: LocalStore) -> int:
    """The pid of the store's server, started and warmed by a session's first calls (its model loaded)."""
    with LocalClient(attach(store.target).connection) as client:
        client.call_tool("store_experience", {"task": TASK, "experience": "use the vault's rotate command"})
        client.call_tool("recall_experience", {"task": TASK})
    return store.server_pid()


def huge_line(size: int, request_id: object, id_first: bool) -> Iterator[bytes]:
    """A ``store_experience`` request of about ``size`` bytes, in pieces of 1 MB (nothing of it is ever held whole
    here): the id first, as the Python SDK writes a request, or last, as the TypeScript SDK does."""
    head = {"name": "store_experience", "arguments": {"task": TASK, "experience": ""}}
    opening, closing = json.dumps(head).rsplit('""', 1)
    ident = json.dumps(request_id)
    if id_first:
        yield f'{{"jsonrpc": "2.0", "id": {ident}, "method": "tools/call", "params": {opening}"'.encode()
    else:
        yield f'{{"method": "tools/call", "params": {opening}"'.encode()
    for _ in range(size // MB):
        yield b"A" * MB
    tail = f'"{closing}}}' if id_first else f'"{closing}, "jsonrpc": "2.0", "id": {ident}}}'
    yield tail.encode() + b"\n"


def test_a_message_of_300_mb_is_refused_by_name_and_the_server_stays_small(store: LocalStore) -> None:
    """A session sends one line of 300 MB, then another with its id at the end. Each is answered with an error
    naming the limit and the setting, to its own id; the server's resident peak grows by a fraction of the line
    (it had held the line whole, then parsed it); nothing was stored; the same session and another go on."""
    pid = started(store)
    before = proc_status(pid)["VmHWM"]
    with Wire(store) as wire:
        wire.send_bytes(huge_line(300 * MB, 7, id_first=True))
        refused = wire.answer(7)
        wire.send_bytes(huge_line(100 * MB, "last", id_first=False))
        refused_too = wire.answer("last")
        grown_mb = (proc_status(pid)["VmHWM"] - before) / 1024
        for answer in (refused, refused_too):
            message = answer["error"]["message"]
            assert "max_message_mb=16" in message and "nothing of it was applied" in message, answer
        assert "314,57" in refused["error"]["message"]  # its size, as it arrived
        assert grown_mb < 100, f"the server's resident peak grew by {grown_mb:.0f} MB"
        memories = wire.result(wire.call("list_memories"))["memories"]
        assert [memory["task"] for memory in memories] == [TASK]
    with LocalClient(attach(store.target).connection) as other:
        assert other.call_tool("recall_experience", {"task": TASK})["memories"]


def test_requests_sent_without_reading_their_answers_cost_a_bounded_memory(store: LocalStore) -> None:
    """Two sessions send a million pings each and read nothing, one with an id of its own per request and one with the
    same id each time (a request whose answer could not be written was a task of the server's, without end: the
    server grew by hundreds of MB and went on growing). Beyond ``max_requests_in_flight`` (256) not yet answered, or
    with the id of one not yet answered, a request is answered at once with an error saying so, and while the
    client does not read that answer nothing more is read: the server's resident memory stops growing within a
    bound (the lines each session's reader holds, up to twice ``max_message_mb``);
    another session is served meanwhile; the answers, read at last, say which requests were served."""
    pid = started(store)
    before = proc_status(pid)["VmRSS"]
    floods = [Wire(store), Wire(store)]
    try:

        def flood(wire: Wire, same_id: bool) -> None:
            wire.connection.settimeout(20)  # the server has stopped reading: enough
            with contextlib.suppress(TimeoutError):
                for start in range(0, 1_000_000, 1000):
                    ids = [1 if same_id else number for number in range(start, start + 1000)]
                    wire.send_bytes([b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % n for n in ids)])
            wire.connection.settimeout(None)

        pairs = zip(floods, (False, True), strict=True)
        senders = [threading.Thread(target=flood, args=pair) for pair in pairs]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        rss = []
        for _ in range(11):  # what the server still does with what it read
            rss.append(proc_status(pid)["VmRSS"])
            time.sleep(1)
        grown_mb, growing_mb = (max(rss) - before) / 1024, (max(rss) - rss[0]) / 1024
        assert growing_mb < 10, f"the server grew by {growing_mb:.0f} MB in the 10 s after the senders stopped"
        assert grown_mb < 200, f"the server grew by {grown_mb:.0f} MB"  # each session's reader holds up to 32 MB
        with LocalClient(attach(store.target).connection) as other:
            assert other.call_tool("recall_experience", {"task": TASK})["memories"]
        said = ("max_requests_in_flight=256", "is the id of a request not yet answered")
        for wire, refused in zip(floods, said, strict=True):  # the answers the sockets' buffers took come first
            messages = (wire.next().get("error", {}).get("message", "") for _ in range(100_000))
            assert any(refused in message for message in messages)
    finally:
        for wire in floods:
            wire.close()


def test_a_greeting_dripped_a_byte_at_a_time_is_dropped_at_its_deadline(store: LocalStore) -> None:
    """A connection that sends its greeting one byte a second, forever in time for a timeout that restarts at each
    byte, is dropped once the greeting's one deadline has passed."""
    started(store)
    hello = encode(store.target.hello("session"))
    connection = connect_socket(store.place, 60)
    assert connection is not None
    opened = time.monotonic()
    dropped = None
    try:
        for byte in hello[:-1]:  # never the newline
            try:
                connection.sendall(bytes([byte]))
                connection.setblocking(False)
                try:
                    if connection.recv(1, socket.MSG_PEEK) == b"":
                        dropped = time.monotonic() - opened
                        break
                except BlockingIOError:
                    pass
                finally:
                    connection.setblocking(True)
            except (BrokenPipeError, ConnectionResetError):
                dropped = time.monotonic() - opened
                break
            if time.monotonic() - opened > GREETING_SECONDS + 20:
                break
            time.sleep(1)
    finally:
        connection.close()
    assert len(hello) > GREETING_SECONDS + 20  # the drip alone would have lasted longer
    assert dropped is not None, f"still connected after {time.monotonic() - opened:.0f} s"
    assert GREETING_SECONDS - 1 < dropped < GREETING_SECONDS + 5


def test_a_thousand_silent_connections_cost_no_thread_and_delay_no_session(store: LocalStore) -> None:
    """A thousand connections that never say a word (each had a thread of its own, waiting for its greeting): the
    server's threads and open files stay where they were, and a session attaches and is served meanwhile."""
    pid = started(store)
    threads = proc_status(pid)["Threads"]
    files = len(os.listdir(f"/proc/{pid}/fd"))
    silent = []
    try:
        for _ in range(1000):
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            silent.append(connection)
            connection.connect(os.fspath(store.place.socket))  # blocking: it waits while the server's backlog is full
        time.sleep(1)  # the server accepted what it would
        assert proc_status(pid)["Threads"] <= threads + 2
        assert len(os.listdir(f"/proc/{pid}/fd")) <= files + UNGREETED + 2
        with LocalClient(attach(store.target).connection) as client:
            assert client.call_tool("recall_experience", {"task": TASK})["memories"]
    finally:
        for connection in silent:
            connection.close()


def test_sessions_beyond_local_max_sessions_are_refused_by_name(store: LocalStore) -> None:
    """Greeted sessions each cost a thread and an event loop: at ``local_max_sessions`` (3 here) one more is
    refused, naming the setting; once one leaves, the next is served."""
    variables = {"MEMRL_LOCAL_MAX_SESSIONS": "3"}
    sessions = [Wire(store, **variables) for _ in range(3)]
    try:
        with pytest.raises(AttachError, match=r"local_max_sessions=3"):
            Wire(store, **variables)
        sessions.pop().close()
        time.sleep(0.5)  # the server saw it leave
        sessions.append(Wire(store, **variables))
        assert sessions[-1].result(sessions[-1].call("recall_experience", task=TASK))["memories"] == []
    finally:
        for wire in sessions:
            wire.close()


def test_a_session_cannot_take_other_bounds_of_the_server_beside_others(store: LocalStore) -> None:
    """The bounds of what a session may take are the server's, or a session could lift its own: one whose own differ
    (here a message limit of 1 GB) is refused beside another session, naming the setting and where it took it from,
    as for the settings of the memory."""
    with Wire(store), pytest.raises(AttachError, match=r"max_message_mb \(the session's from environment MEMRL_MAX"):
        Wire(store, MEMRL_MAX_MESSAGE_MB="1024")


def test_the_servers_of_project_folders_no_session_uses_are_freed(store: LocalStore, tmp_path: Path) -> None:
    """Each session of a new project folder (its project_dir) is served by an MCP server of its own settings, which
    was kept for good: hundreds of folders, one session each one after another, grew the server by a third of a MB
    each. Past the first ones, its resident memory stays where it was."""
    pid = started(store)

    def visit(number: int) -> None:
        folder = tmp_path / "projects" / f"project-{number}"
        with LocalClient(attach(store.target_with(MEMRL_PROJECT_DIR=str(folder))).connection) as client:
            client.call_tool("recall_experience", {"task": TASK})

    for number in range(40):  # the memory's first uses: caches, arenas, the namespaces' first writes
        visit(number)
    settled = proc_status(pid)["VmRSS"]
    for number in range(40, 240):
        visit(number)
    grown_mb = (proc_status(pid)["VmRSS"] - settled) / 1024
    assert grown_mb < 50, f"200 more project folders grew the server by {grown_mb:.1f} MB"


def test_a_flood_of_writes_takes_a_few_threads_and_another_session_is_served_meanwhile(store: LocalStore) -> None:
    """One session keeps 200 writes in flight (each a worker thread's, up to anyio's 40 per event loop, so one
    session could take every core): the server's threads grow by at most the session's ``local_session_threads``,
    and another session's recalls are answered while the flood lasts. Latency figures: perf/local_fairness.py
    (docs/performance.md)."""
    pid = started(store)
    flooding = threading.Event()
    recalls = 0
    with LocalClient(attach(store.target).connection) as recaller, Wire(store) as flood:
        recaller.call_tool("recall_experience", {"task": TASK})
        threads = most = proc_status(pid)["Threads"]  # both sessions attached, neither calling

        def recall_meanwhile() -> None:
            nonlocal recalls
            while flooding.is_set():
                recaller.call_tool("recall_experience", {"task": TASK})
                recalls += 1

        flooding.set()
        ids = [flood.call("store_experience", task=f"flood {i}: {TASK} {i * 7919}", experience="x") for i in range(200)]
        recalling = threading.Thread(target=recall_meanwhile)
        recalling.start()
        for request_id in ids:
            most = max(most, proc_status(pid)["Threads"])
            flood.result(request_id)
        flooding.clear()
        recalling.join(timeout=120)
    assert recalls > 0
    allowed = ServingSettings.model_fields["local_session_threads"].default + 1  # + one call of the recaller's
    assert most - threads <= allowed, f"{most - threads} more threads during the flood"
