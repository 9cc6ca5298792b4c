"""The real ``memrl-mcp`` process over its transports: stdio and streamable HTTP, restarts, locks, bad settings.

Every test spawns the server as a child process (with its own data dir under ``tmp_path``) and talks to it
with the MCP SDK's own client, exactly as an agent would.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.support.mcp import call, read_json, refused
from tests.support.servers import CLI, DEADLINE_S, EVERY_TOOL, TOOLS, child_env, http_server, run_cli, stdio_server
from tests.support.stores import ENGINES

TASK = "Sort a CSV file by its second column and write the result to a new file"
EXPERIENCE = "1. Read with csv.reader. 2. sorted(rows, key=lambda r: r[1]). 3. Write with csv.writer."


async def store_recall_report(client: Client) -> None:
    """The agent's loop on a fresh memory: store, recall it back, report a success on it."""
    stored = await call(client, "store_experience", task=TASK, experience=EXPERIENCE)
    assert stored["merged"] is False
    memory_id = stored["id"]
    assert stored["memory"]["q"] == 0.0

    recall = await call(client, "recall_experience", task=TASK)
    assert recall["namespace"] == "default"
    assert recall["candidates"] == 1
    [memory] = recall["memories"]
    assert memory["id"] == memory_id
    assert memory["task"] == TASK
    assert memory["experience"] == EXPERIENCE
    assert memory["similarity"] > 0.99  # the very same task
    assert math.isfinite(memory["score"])

    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    assert report["recall_id"] == recall["recall_id"]
    assert report["updated"] == [{"id": memory_id, "q_before": 0.0, "q_after": pytest.approx(0.3), "visits": 1}]
    assert report["missing"] == []
    assert report["stored"] is None

    stats = await read_json(client, "memrl://stats")  # in every tool profile
    assert (stats["memories"], stats["visits"], stats["recalls_reported"], stats["recalls_pending"]) == (1, 1, 1, 0)


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_stdio_console_script_round_trip(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("memrl-mcp")
    assert script.is_file(), "the memrl-mcp console script is not installed next to this interpreter"
    server = StdioServerParameters(command=str(script), args=["--data-dir", str(tmp_path / "data")], env=child_env())
    with anyio.fail_after(DEADLINE_S):
        async with Client(server) as client:
            tools = await client.list_tools()  # the default profile: the learning loop
            assert [tool.name for tool in tools.tools] == ["recall_experience", "report_outcome", "store_experience"]
            await store_recall_report(client)
    # --data-dir, not the user's folder, holds the store.
    assert (tmp_path / "data" / "memrl" / "edge").is_dir()


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_streamable_http_round_trip_and_two_sessions(tmp_path: Path) -> None:
    with http_server(tmp_path / "data", tmp_path) as server, anyio.fail_after(DEADLINE_S):
        url = server.url
        async with Client(url) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            await store_recall_report(client)

        # Two sessions at once on one server share one memory (in a namespace of their own).
        async with Client(url) as writer, Client(url) as reader:
            task, team = "Resize a PNG image to 64x64 pixels", "team"
            stored = await call(writer, "store_experience", task=task, experience="Use PIL", namespace=team)
            recall = await call(reader, "recall_experience", task=task, namespace=team)
            assert [m["id"] for m in recall["memories"]] == [stored["id"]]
            report = await call(
                reader, "report_outcome", recall_id=recall["recall_id"], reward=1.0, experience="x", outcome="failure"
            )
            assert report["updated"] == [
                {"id": stored["id"], "q_before": 0.0, "q_after": pytest.approx(0.3), "visits": 1}
            ]
            assert report["stored"]["merged"] is False
            assert report["stored"]["memory"]["outcome"] == "failure"
            assert report["stored"]["memory"]["namespace"] == team
            # The writer's session sees what the reader's did.
            stats = await call(writer, "memory_stats", namespace=team)
            assert (stats["memories"], stats["successes"], stats["failures"]) == (2, 1, 1)
            assert (stats["visits"], stats["recalls_reported"], stats["recalls_pending"]) == (1, 1, 0)
            assert (await call(writer, "memory_stats"))["memories"] == 3


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_memory_and_pending_recall_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with anyio.fail_after(DEADLINE_S):
        async with Client(stdio_server(data_dir)) as first:
            stored = await call(first, "store_experience", task=TASK, experience=EXPERIENCE)
            recall_id = (await call(first, "recall_experience", task=TASK))["recall_id"]

        async with Client(stdio_server(data_dir)) as second:
            stats = await call(second, "memory_stats")
            assert (stats["memories"], stats["recalls_pending"], stats["recalls_reported"]) == (1, 1, 0)
            recall = await call(second, "recall_experience", task=TASK)
            assert [m["id"] for m in recall["memories"]] == [stored["id"]]

            report = await call(second, "report_outcome", recall_id=recall_id, reward=1.0)
            assert report["updated"] == [
                {"id": stored["id"], "q_before": 0.0, "q_after": pytest.approx(0.3), "visits": 1}
            ]
            message = await refused(second, "report_outcome", recall_id=recall_id, reward=1.0)
            assert "already reported" in message
            assert recall_id in message

            stats = await call(second, "memory_stats")
            assert (stats["recalls_pending"], stats["recalls_reported"], stats["visits"]) == (1, 1, 1)


@pytest.mark.slow  # a server process
@pytest.mark.anyio
@pytest.mark.parametrize("engine", ENGINES)
async def test_second_process_on_a_held_store_is_refused(tmp_path: Path, engine: str) -> None:
    data_dir = tmp_path / "data"
    with http_server(data_dir, tmp_path, MEMRL_EMBEDDED_ENGINE=engine) as server:
        started = time.monotonic()
        second = run_cli("--data-dir", str(data_dir), env=child_env(MEMRL_EMBEDDED_ENGINE=engine))
        assert time.monotonic() - started < 20
        assert second.returncode != 0
        assert second.stdout == ""  # nothing on the protocol's wire
        assert "Traceback" not in second.stderr
        assert "another process" in second.stderr
        assert "streamable-http" in second.stderr
        assert "MEMRL_QDRANT_URL" in second.stderr
        assert str(data_dir) in second.stderr

        # The refused process left the holder's store intact and usable.
        with anyio.fail_after(DEADLINE_S):
            async with Client(server.url) as client:
                stored = await call(client, "store_experience", task=TASK, experience=EXPERIENCE)
                recall = await call(client, "recall_experience", task=TASK)
                assert [m["id"] for m in recall["memories"]] == [stored["id"]]


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_http_server_stopped_by_sigterm_keeps_its_memory(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with anyio.fail_after(DEADLINE_S):
        with http_server(data_dir, tmp_path) as server:
            async with Client(server.url) as client:
                stored = await call(client, "store_experience", task=TASK, experience=EXPERIENCE)
                recall_id = (await call(client, "recall_experience", task=TASK))["recall_id"]
        assert server.proc.returncode is not None

        async with Client(stdio_server(data_dir)) as client:
            stats = await call(client, "memory_stats")
            assert (stats["memories"], stats["recalls_pending"]) == (1, 1)
            report = await call(client, "report_outcome", recall_id=recall_id, reward=1.0)
            assert [(c["id"], c["q_after"]) for c in report["updated"]] == [(stored["id"], pytest.approx(0.3))]

    # SIGTERM ends the server the way Ctrl+C does: cli.main's `finally: service.close()` flushes and
    # closes the store, and the exit status is 0.
    assert server.proc.returncode == 0, server.log_path.read_text()


@pytest.mark.slow  # the CLI in a child process
def test_bad_environment_setting_is_refused(tmp_path: Path) -> None:
    result = run_cli(env=child_env(tmp_path / "data", MEMRL_K1="0"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "k1" in result.stderr
    assert "greater than or equal to 1" in result.stderr
    assert not (tmp_path / "data").exists()  # refused before opening any store


@pytest.mark.slow  # the CLI in a child process
def test_inconsistent_yaml_settings_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text("retrieval:\n  k1: 3\n  k2: 9\n")
    result = run_cli("--config", str(config), env=child_env(tmp_path / "data"))
    assert result.returncode == 2
    assert "k2 (9) must not exceed k1 (3)" in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.slow  # the CLI in a child process
def test_unknown_yaml_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text("retrieval:\n  k1: 3\n  bogus_knob: 1\n")
    result = run_cli("--config", str(config), env=child_env(tmp_path / "data"))
    assert result.returncode == 2
    assert "retrieval.bogus_knob: no such setting in retrieval" in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_stdio_serves_large_and_concurrent_requests_on_its_own_pipes(tmp_path: Path) -> None:
    """The stdio server reads and writes its pipes on the event loop (memrl_mcp/transports/stdio.py): a request line of
    several times asyncio's default 64 KiB line limit is read whole; answers to many requests in flight at once all
    arrive, each to its request, while the client reads them as fast as it likes."""
    steps = [
        {"observation": f"room {i}: " + "a dusty shelf, " * 500, "action": f"take {i}", "reward": 0.0}
        for i in range(40)
    ]
    steps[-1]["reward"] = 1.0
    assert len(json.dumps(steps)) > 4 * 65536
    with anyio.fail_after(DEADLINE_S):
        async with Client(stdio_server(tmp_path / "data")) as client:
            result = await call(client, "report_trajectory", task=TASK, steps=steps, episode_id="long")
            assert (result["steps"], result["created"]) == (40, 40)

            answers: dict[int, dict] = {}

            async def store(i: int) -> None:
                answers[i] = await call(client, "store_experience", task=f"{TASK} number {i}", experience=f"way {i}")

            async with anyio.create_task_group() as group:
                for i in range(30):
                    group.start_soon(store, i)
            assert sorted(answers) == list(range(30))
            assert all(answers[i]["memory"]["experience"] == f"way {i}" for i in answers)
            assert (await call(client, "memory_stats"))["memories"] == 30


def opening(**capabilities: object) -> list[dict[str, Any]]:
    """A client's handshake, as the first lines of a stdin."""
    client = {"name": "file", "version": "1"}
    params = {"protocolVersion": "2025-06-18", "capabilities": capabilities, "clientInfo": client}
    return [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]


def tool_call(request_id: int, name: str, **arguments: object) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def serve_to_the_end(
    tmp_path: Path, messages: list[dict[str, Any]], stdin: str = "pipe", stdout: str = "pipe"
) -> list[dict[str, Any]]:
    """Run the server on ``messages`` written to its stdin (a pipe or a file) and closed; what it wrote to its stdout
    (a pipe or a file) by the time it exited on its own."""
    lines = "".join(json.dumps(message) + "\n" for message in messages).encode()
    (tmp_path / "requests.jsonl").write_bytes(lines)
    with (tmp_path / "requests.jsonl").open("rb") as requests, (tmp_path / "answers.jsonl").open("wb+") as answers:
        done = subprocess.run(
            [*CLI, "--data-dir", str(tmp_path / "data")],
            input=lines if stdin == "pipe" else None,
            stdin=None if stdin == "pipe" else requests,
            stdout=subprocess.PIPE if stdout == "pipe" else answers,
            stderr=subprocess.PIPE,
            env=child_env(**EVERY_TOOL),
            timeout=DEADLINE_S,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        answers.seek(0)
        written = done.stdout if stdout == "pipe" else answers.read()
    return [json.loads(line) for line in written.decode().splitlines()]


MODERN = {  # the 2026-07-28 envelope each request carries instead of a handshake
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "file", "version": "1"},
}


@pytest.mark.slow  # a server process
@pytest.mark.parametrize(
    ("stdin", "stdout", "era"),
    [("pipe", "pipe", "handshake"), ("pipe", "file", "handshake"), ("file", "pipe", "handshake"),
     ("file", "file", "handshake"), ("pipe", "pipe", "2026-07-28")],
)  # fmt: skip
def test_every_request_before_the_end_of_stdin_is_answered(tmp_path: Path, stdin: str, stdout: str, era: str) -> None:
    """A client may write its requests and close stdin at once (``memrl-mcp < requests.jsonl``, a shell pipe): each
    is answered, and each write made, before the server exits. The SDK cancels the calls still running at the end of
    its read stream: 9-16 of 21 such requests were answered. A file is served by the SDK's threaded transport, a
    pipe by the event loop's; both protocol eras."""
    requests = [tool_call(i, "store_experience", task=f"{TASK} {i}", experience=f"way {i}") for i in range(1, 41)]
    requests.append({"jsonrpc": "2.0", "id": 41, "method": "tools/list", "params": {}})
    if era == "handshake":
        answers = serve_to_the_end(tmp_path, [*opening(), *requests], stdin, stdout)
        assert answers[0]["result"]["serverInfo"]["name"] == "memrl-mcp"
    else:
        for request in requests:
            request["params"]["_meta"] = MODERN
        answers = [{"id": 0}, *serve_to_the_end(tmp_path, requests, stdin, stdout)]
    by_id = {answer["id"]: answer for answer in answers}
    assert sorted(by_id) == list(range(42)) and len(answers) == 42
    for i in range(1, 41):
        stored = by_id[i]["result"]["structuredContent"]
        assert stored["memory"]["experience"] == f"way {i}"
    assert {tool["name"] for tool in by_id[41]["result"]["tools"]} == TOOLS
    stats = serve_to_the_end(tmp_path, [*opening(), tool_call(1, "memory_stats")])[-1]
    assert stats["result"]["structuredContent"]["memories"] == 40


@pytest.mark.slow  # a child process
def test_a_client_that_reads_late_gets_every_answer_whole(tmp_path: Path) -> None:
    """Answers larger than the pipe holds, to a client that closed stdin and reads only later: the server waits for
    the pipe to take each answer. The event loop's transport kept up to 64 KB the pipe did not take yet, and dropped
    it when it closed: the client read the second answer cut off in its middle, and not the third."""
    way = "Check the rotated files. " * 1400  # each answer is about 36 KB; a pipe takes 62-64 KB of them
    stores = [tool_call(i, "store_experience", task=f"{TASK} number {i}", experience=way) for i in range(1, 4)]
    lines = "".join(json.dumps(message) + "\n" for message in [*opening(), *stores]).encode()
    server = subprocess.Popen(
        [*CLI, "--data-dir", str(tmp_path / "data")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(**EVERY_TOOL, MEMRL_MAX_EXPERIENCE_CHARS="40000"),
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write(lines)
        server.stdin.close()
        deadline = time.monotonic() + DEADLINE_S
        while pipe_holds(server.stdout.fileno()) < 48_000 and time.monotonic() < deadline:  # two answers in
            time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(5)  # the old transport exited here (in 1.6 s) with its rest dropped; this one waits
        answers = [json.loads(line) for line in server.stdout.read().decode().splitlines()]
        assert server.wait(DEADLINE_S) == 0
    finally:
        server.kill()
    assert sorted(answer["id"] for answer in answers) == list(range(4))
    assert all(way in json.dumps(answer["result"]["structuredContent"]) for answer in answers if answer["id"])


def pipe_holds(fd: int) -> int:
    """How many bytes wait in the pipe ``fd`` reads."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


STEPS_WITHOUT_THE_LAST_REWARD = [
    {"observation": "$ ls /etc/logrotate.d", "action": "cat /etc/logrotate.d/nginx", "reward": 0.0},
    {"observation": "(empty)", "action": "write daily, rotate 7, compress"},
]


@pytest.mark.slow  # a server process
def test_a_question_to_a_client_that_closed_stdin_fails_at_once(tmp_path: Path) -> None:
    """A call asking the user (elicitation, 600 s by default) when stdin ends: the client can never answer, so the
    question fails at once, the call answers that nothing was reported, and the server exits."""
    report = tool_call(1, "report_trajectory", task=TASK, steps=STEPS_WITHOUT_THE_LAST_REWARD, episode_id="e-1")
    started = time.monotonic()
    answers = serve_to_the_end(tmp_path, [*opening(elicitation={}), report])
    assert time.monotonic() - started < 60
    (question,) = [answer for answer in answers if answer.get("method") == "elicitation/create"]
    assert TASK in question["params"]["message"]
    (answer,) = [answer for answer in answers if answer.get("id") == 1 and "result" in answer]
    text = answer["result"]["content"][0]["text"]
    assert "the client answered elicitation/create with an error: the client closed stdin" in text
    stats = serve_to_the_end(tmp_path, [*opening(), tool_call(1, "memory_stats")])[-1]
    assert stats["result"]["structuredContent"]["steps"] == 0


@pytest.mark.slow  # a server process
def test_a_call_the_client_cancelled_does_not_hold_the_end(tmp_path: Path) -> None:
    """A request the client cancelled is never answered (the protocol forbids it): the end of stdin does not wait
    for its answer (``DRAIN_SECONDS``, a minute) but exits as soon as the others are answered."""
    report = tool_call(1, "report_trajectory", task=TASK, steps=STEPS_WITHOUT_THE_LAST_REWARD, episode_id="e-1")
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "gone"}}
    unhashable = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1], "reason": "?"}}
    started = time.monotonic()
    messages = [*opening(elicitation={}), report, unhashable, cancel, tool_call(2, "memory_stats")]
    answers = serve_to_the_end(tmp_path, messages)
    assert time.monotonic() - started < 30
    assert [answer["id"] for answer in answers if "result" in answer] == [0, 2]
