"""A stop repeated while a server closes its store, performed on real server processes: the HTTP server
(``memrl-mcp --transport streamable-http``, what a service manager stops) and the user's local server (``memrl-mcp
local run``). Each is written to until its close has work to do (memories its engine holds unflushed), stopped with
SIGTERM, then sent SIGTERM again every few milliseconds until it exits, so that some arrive while its store closes.
Before the fix the second one raised inside the close and cut its flush short: the process died with a traceback, and
the next start found an unclean store to count again."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import stdio_client

from tests.support.local import local_store
from tests.support.mcp import call
from tests.support.servers import CLI, EVERY_TOOL, START_TIMEOUT_S, child_env, free_port, run_cli, stdio_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # server processes, stopped by signals
WRITERS, EACH = 4, 200  # 800 memories: fewer than a table's writes between flushes (edge.FLUSH_EVERY), all unflushed
EXPERIENCE = "Step {n}: " + "check the logs, then the configuration, then the deploy. " * 300  # ~17,000 characters
REPEAT_S = 0.005
START_S = 240
DISTINCT = {"MEMRL_MERGE_THRESHOLD": "1.0"}  # the tasks differ by numbers only: no merge, one memory each
UNCLEAN = "no counts were saved at the last close"  # the next open's word for a store not closed cleanly


async def write(client: Client, writer: int) -> list[str]:
    """Store EACH memories, distinct tasks; the ids acknowledged."""
    ids = []
    for n in range(EACH):
        task = f"writer {writer} task {n}: restart service {n * 7919 % 1000} on host {writer}-{n}"
        stored = await call(client, "store_experience", task=task, experience=EXPERIENCE.format(n=n))
        assert not stored["merged"]
        ids.append(stored["id"])
    return ids


@contextmanager
def repeated_stops(process: subprocess.Popen[bytes], stopped_listening: Callable[[], bool]) -> Iterator[list[float]]:
    """SIGTERM now, then again every REPEAT_S from the moment the server no longer listens (its close comes next)
    until it exits; yields the times each was sent."""
    sent: list[float] = []

    def repeat() -> None:
        while process.poll() is None and not stopped_listening():
            time.sleep(0.001)
        while process.poll() is None:
            process.send_signal(signal.SIGTERM)
            sent.append(time.time())
            time.sleep(REPEAT_S)

    process.send_signal(signal.SIGTERM)
    thread = threading.Thread(target=repeat, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        thread.join(timeout=120)


def logged(log: Path) -> list[tuple[float, str]]:
    """The server's JSON log lines: (Unix time, message)."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [(datetime.fromisoformat(line["time"]).timestamp(), line["message"]) for line in lines]


def assert_closed_cleanly(process: subprocess.Popen[bytes], log: Path, data_dir: Path, sent: list[float]) -> None:
    """The process exited 0, its close ran to its end although stops were sent during it, and left the marks of a
    clean close: the counts of memory_stats and of the quotas, saved only once everything is flushed and closed."""
    assert process.returncode == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    engine = data_dir / "memrl" / "edge"
    assert (engine / "memories.tally.json").is_file() and (engine / "usage.json").is_file()
    times = dict((message, at) for at, message in logged(log))
    closing, closed = times["closing the memory store"], times["memory store closed"]
    during = [at for at in sent if closing < at < closed]
    assert during, f"no SIGTERM was sent while the store closed ({closed - closing:.3f} s): the attack was not made"


async def assert_every_write_is_there(data_dir: Path, acknowledged: set[str], tmp: Path) -> None:
    """The next start finds every acknowledged memory, and nothing to recover: its counts were the ones saved at the
    close (a store not closed cleanly is counted again, and says so in the log)."""
    log = tmp / "next-start.log"
    with anyio.fail_after(START_S), log.open("w") as errlog:
        async with Client(stdio_client(stdio_server(data_dir), errlog=errlog)) as client:
            assert (await call(client, "memory_stats"))["memories"] == len(acknowledged)
    assert UNCLEAN not in log.read_text()
    exported = tmp / "export.jsonl"
    done = run_cli("export", "--out", str(exported), "--data-dir", str(data_dir), env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert {json.loads(line)["id"] for line in exported.read_text().splitlines()} == acknowledged


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


async def test_an_http_server_stopped_again_while_it_closes_finishes_its_close(tmp_path: Path) -> None:
    data_dir, log, port = tmp_path / "data", tmp_path / "server.log", free_port()
    command = [*CLI, "--transport", "streamable-http", "--port", str(port), "--data-dir", str(data_dir)]
    server = start(command, child_env(**EVERY_TOOL | DISTINCT), log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not listening(port):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        acknowledged: set[str] = set()

        async def writer(number: int) -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                acknowledged.update(await write(client, number))

        with anyio.fail_after(START_S):
            async with anyio.create_task_group() as group:
                for number in range(WRITERS):
                    group.start_soon(writer, number)
        with repeated_stops(server, lambda: not listening(port)) as sent:
            server.wait(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    assert len(acknowledged) == WRITERS * EACH
    assert_closed_cleanly(server, log, data_dir, sent)
    await assert_every_write_is_there(data_dir, acknowledged, tmp_path)


async def test_the_local_server_stopped_again_while_it_closes_finishes_its_close(tmp_path: Path) -> None:
    with local_store(tmp_path) as store:
        log = tmp_path / "local-server.log"
        server = start([*CLI, "local", "run"], store.env(**DISTINCT), log)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while store.status() is None:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            acknowledged: set[str] = set()

            async def writer(number: int) -> None:
                async with Client(store.session(**DISTINCT)) as client:
                    acknowledged.update(await write(client, number))

            with anyio.fail_after(START_S):
                async with anyio.create_task_group() as group:
                    for number in range(WRITERS):
                        group.start_soon(writer, number)
            with repeated_stops(server, lambda: not store.place.socket.exists()) as sent:
                server.wait(timeout=120)
        finally:
            if server.poll() is None:
                server.kill()
        assert len(acknowledged) == WRITERS * EACH
        assert_closed_cleanly(server, log, store.data_dir, sent)
        await assert_every_write_is_there(store.data_dir, acknowledged, tmp_path)
