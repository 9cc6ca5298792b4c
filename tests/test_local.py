"""One memory for every session: ``memrl-mcp`` over stdio attaches to the user's local server of the store, through
real MCP clients (the Python SDK's, and the TypeScript SDK's in tests/ts_client) and real processes. Each test has a
runtime folder of its own (tests/support/local.py), so no server is shared between tests."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types

from memrl_mcp.local.attach import attach
from memrl_mcp.local.client import LocalClient, ToolCallError
from memrl_mcp.projects import project_namespace
from tests.support.local import LocalStore, local_store, python_with, servers_of
from tests.support.mcp import Held, call, text_of
from tests.support.node import CLIENT, node_with_sdk
from tests.support.servers import CLI

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # every test starts servers

ALPHA, BETA = "file:///home/ann/code/alpha", "file:///home/ann/code/beta"
START_S = 240  # sessions started together on a loaded machine: one cold start, then the others attach


class User:
    """A user who says every task succeeded (an elicitation callback); the questions are kept."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"succeeded": True})


def offering(*uris: str) -> Any:
    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in uris])

    return list_roots


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    with local_store(tmp_path) as found:
        yield found


@asynccontextmanager
async def session(store: LocalStore, *args: str, **options: Any) -> AsyncIterator[Client]:
    """A real stdio session of the Python SDK's client; ``options`` of the SDK's Client, and ``env`` variables."""
    variables = options.pop("env", {})
    async with Client(store.session(*args, **variables), **options) as client:
        yield client


async def report_asking_the_user(client: Client, task: str) -> dict[str, Any]:
    """Store ``task``'s lesson, recall it, and report without a reward: the server asks this session's user."""
    await call(client, "store_experience", task=task, experience=f"how to {task}")
    recall = await call(client, "recall_experience", task=task)
    return await call(client, "report_outcome", recall_id=recall["recall_id"], experience="it worked")


async def typescript_session(node: str, store: LocalStore, task: str, expected: list[str]) -> dict[str, Any]:
    env = store.env(MCP_TEST_SERVER=json.dumps(CLI), MCP_TEST_TASK=task, MCP_TEST_EXPECT=json.dumps(expected))
    done = await anyio.run_process([node, "share.mjs"], cwd=CLIENT, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def node() -> str:
    return node_with_sdk()


async def test_sessions_started_together_share_one_server_and_its_memory(node: str, store: LocalStore) -> None:
    """Four Python and two TypeScript sessions start at the same moment on one store: every one initializes, they
    end on one server, each finds the lessons of all the others, and each report's question reaches its own user."""
    python_tasks = [f"deploy service number {i} to the staging cluster" for i in range(4)]
    typescript_tasks = [f"rotate the logs of machine number {i}" for i in range(2)]
    everything = python_tasks + typescript_tasks
    users = [User() for _ in python_tasks]
    found: dict[str, list[str]] = {}
    reports: dict[str, dict[str, Any]] = {}

    async def python_session(task: str, user: User) -> None:
        async with session(store, elicitation_callback=user, mode="legacy") as client:
            reports[task] = await report_asking_the_user(client, task)
            while True:
                page = await call(client, "list_memories", limit=100)
                found[task] = [memory["task"] for memory in page["memories"]]
                if set(everything) <= set(found[task]):
                    return
                await anyio.sleep(0.1)

    async def ts_session(task: str) -> None:
        out = await typescript_session(node, store, task, everything)
        found[task], reports[task] = out["tasks"], out["report"] | {"asked": out["asked"]}

    with anyio.fail_after(START_S):
        async with anyio.create_task_group() as group:
            for task, user in zip(python_tasks, users, strict=True):
                group.start_soon(python_session, task, user)
            for task in typescript_tasks:
                group.start_soon(ts_session, task)
    assert all(set(everything) <= set(tasks) for tasks in found.values()), found
    assert len(servers_of(store.runtime_dir)) == 1  # one owner; a second could not have opened the store anyway
    for task, user in zip(python_tasks, users, strict=True):
        (question,) = user.asked  # its own question, and no other session's
        assert task in question
        assert reports[task]["reward"] == 1.0 and reports[task]["reward_source"] == "user"
    for task in typescript_tasks:
        (question,) = reports[task]["asked"]
        assert task in question and reports[task]["reward_source"] == "user"


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # the handshake protocol; 2026-07-28 (InputRequiredResult)
async def test_a_question_reaches_only_the_session_that_asked(store: LocalStore, mode: str) -> None:
    """Two sessions report at the same moment without a reward (each also has its client's model write the
    experience from a trajectory): each question and each sampling request goes to its own session only."""
    tasks = ["migrate the billing database", "renew the TLS certificate of the mail server"]
    users = [User(), User()]
    models: list[list[str]] = [[], []]  # the text each session's model was asked

    def model_of(asked: list[str]) -> Any:
        async def model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            content = params.messages[0].content
            assert isinstance(content, types.TextContent), content
            asked.append(content.text)
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text="1. Plan. 2. Do."), model="m"
            )

        return model

    async def reporter(index: int) -> None:
        options = {"elicitation_callback": users[index], "sampling_callback": model_of(models[index]), "mode": mode}
        async with session(store, **options) as client:
            task = tasks[index]
            await call(client, "store_experience", task=task, experience="first try")
            recall = await call(client, "recall_experience", task=task)
            trajectory = f"$ start {index}\nok"
            result = await call(client, "report_outcome", recall_id=recall["recall_id"], trajectory=trajectory)
            assert (result["reported"], result["reward_source"]) == (True, "user")
            assert result["stored"]["memory"]["experience_source"] == "client_model"

    with anyio.fail_after(START_S):
        async with anyio.create_task_group() as group:
            for index in range(2):
                group.start_soon(reporter, index)
    for index, task in enumerate(tasks):
        (question,) = users[index].asked
        assert task in question and tasks[1 - index] not in question
        (request,) = models[index]
        assert f"$ start {index}" in request and f"$ start {1 - index}" not in request


async def test_one_recall_reported_from_several_sessions_at_once_asks_one_question(store: LocalStore) -> None:
    """The sessions of the local server share one MCP server per settings, on threads of their own: the holds of
    the questions they ask (at most one per recall) must hold across them. Two sessions send ten reports each of one
    recall, without a reward, at the same moment: one question in all, the other nineteen refused by name."""
    calls = 10
    asked: list[str] = []
    refused: list[str] = []
    every_other_answered = anyio.Event()

    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        with anyio.move_on_after(60):  # the question stays open while the other reports arrive
            await every_other_answered.wait()
        return types.ElicitResult(action="accept", content={"succeeded": True})

    async def report(client: Client, recall_id: str) -> None:
        result = await client.call_tool("report_outcome", {"recall_id": recall_id, "experience": "it worked"})
        if result.is_error:
            refused.append(" ".join(getattr(block, "text", "") for block in result.content))
            if len(refused) == 2 * calls - 1:
                every_other_answered.set()

    with anyio.fail_after(START_S):
        async with (
            session(store, elicitation_callback=user) as first,
            session(store, elicitation_callback=user) as other,
        ):
            await call(first, "store_experience", task="rotate the nightly logs", experience="logrotate daily")
            recall = await call(first, "recall_experience", task="rotate the nightly logs")
            async with anyio.create_task_group() as group:
                for client in (first, other) * calls:
                    group.start_soon(report, client, recall["recall_id"])
            stats = await call(other, "memory_stats")
    assert len(asked) == 1 and len(refused) == 2 * calls - 1
    assert all("another report of recall_id" in message for message in refused), refused[0]
    assert stats["recalls_reported"] == 1 and stats["visits"] == 1


async def recalled(client: Client, tasks: list[str]) -> list[str]:
    """The recall ids of ``tasks``, each stored first."""
    ids = []
    for task in tasks:
        await call(client, "store_experience", task=task, experience=f"how to {task}")
        ids.append((await call(client, "recall_experience", task=task))["recall_id"])
    return ids


async def until_asked(holding: Held, count: int) -> None:
    while len(holding.asked) < count:
        await anyio.sleep(0.01)


async def test_one_sessions_open_questions_never_refuse_another_sessions_reports(store: LocalStore) -> None:
    """Sessions of the local server have no tokens: their questions once counted against one tokenless bound, so
    eight unanswered questions of one session made every other session's report without a reward fail for as long
    as they waited (up to 600 s). Each session has its own bound now: the ninth report of the session that asks eight
    is refused by name, and another session's report is asked and applied meanwhile."""
    first, other = Held(), Held()
    with anyio.fail_after(START_S):
        async with (
            session(store, elicitation_callback=first.user, mode="legacy") as busy,
            session(store, elicitation_callback=other.user, mode="legacy") as calm,
            anyio.create_task_group() as group,
        ):
            mine = await recalled(busy, [f"rebuild the search index of shard {i}" for i in range(9)])
            (theirs,) = await recalled(calm, ["renew the certificate of the mail server"])
            for recall_id in mine[:8]:
                group.start_soon(functools.partial(call, busy, "report_outcome", recall_id=recall_id))
            await until_asked(first, 8)
            other.release.set()
            answered = await call(calm, "report_outcome", recall_id=theirs)
            assert (answered["reported"], answered["reward_source"]) == (True, "user")
            ninth = await busy.call_tool("report_outcome", {"recall_id": mine[8]})
            assert ninth.is_error
            limit = "this session has 8 reports waiting for the client's answers (max_open_questions_per_token=8)"
            assert limit in text_of(ninth)
            first.release.set()
    assert (len(first.asked), len(other.asked)) == (8, 1)


async def test_a_recall_is_asked_about_once_across_sessions_of_other_settings(store: LocalStore) -> None:
    """Sessions of other settings of their own are served by other MCP servers in the local server: the hold of a
    recall's question must hold across them too. Two such sessions report one recall at the same moment: one
    question in all, the other report refused by name."""
    holding = Held()
    with anyio.fail_after(START_S):
        async with (
            session(store, elicitation_callback=holding.user, mode="legacy") as one,
            session(store, elicitation_callback=holding.user, env={"MEMRL_TOOL_PROFILE": "steps"}) as two,
            anyio.create_task_group() as group,
        ):
            (recall_id,) = await recalled(one, ["compact the logs of the build farm"])
            group.start_soon(lambda: call(one, "report_outcome", recall_id=recall_id))
            await until_asked(holding, 1)
            second = None
            with anyio.move_on_after(60):  # a second question would hold the call: then the asserts below fail
                second = await two.call_tool("report_outcome", {"recall_id": recall_id})
            holding.release.set()
    assert len(holding.asked) == 1
    assert second is not None and second.is_error and "another report of recall_id" in text_of(second)


async def test_a_sessions_own_bounds_on_questions_and_samplings_apply(store: LocalStore) -> None:
    """A session's own ``max_samplings_per_minute`` and ``max_open_questions_per_token`` (its environment, as a
    client's configuration sets them) were silently ignored: the server's applied. Now each session has its own:
    at 0 samplings a minute its model is never asked, at one open question its second report is refused; a session
    of the defaults beside them gets its model's experience."""
    frugal, strict, plain = Held(), Held(), Held()
    plain.release.set()
    frugal.release.set()
    options = {"sampling_callback": frugal.model, "env": {"MEMRL_MAX_SAMPLINGS_PER_MINUTE": "0"}}
    with anyio.fail_after(START_S):
        async with (
            session(store, sampling_callback=plain.model) as defaults,  # the first: the server has its settings
            session(store, **options) as no_samplings,
            session(store, elicitation_callback=strict.user, env={"MEMRL_MAX_OPEN_QUESTIONS_PER_TOKEN": "1"}) as one,
            anyio.create_task_group() as group,
        ):
            task = "drain the message queue before the upgrade"
            refused = await no_samplings.call_tool("store_experience", {"task": task, "trajectory": "$ drain\nok"})
            assert refused.is_error
            assert "(max_samplings_per_minute=0)" in text_of(refused), text_of(refused)
            written = await call(defaults, "store_experience", task=task, trajectory="$ drain\nok")
            assert written["memory"]["experience_source"] == "client_model"
            first, second = await recalled(one, ["vacuum the analytics database", "rotate the API keys"])
            group.start_soon(lambda: call(one, "report_outcome", recall_id=first))
            await until_asked(strict, 1)
            beyond = await one.call_tool("report_outcome", {"recall_id": second})
            assert beyond.is_error
            assert "this session has 1 reports waiting" in text_of(beyond)
            assert "(max_open_questions_per_token=1)" in text_of(beyond)
            strict.release.set()
    assert (len(frugal.asked), len(strict.asked), len(plain.asked)) == (0, 1, 1)


async def test_each_session_has_its_roots_namespace_and_profile(store: LocalStore) -> None:
    """Per session: the project namespace of its roots, its own MEMRL_NAMESPACE, its own tool profile."""
    with anyio.fail_after(START_S):
        stack = AsyncExitStack()
        async with stack:
            alpha = await stack.enter_async_context(session(store, list_roots_callback=offering(ALPHA), mode="legacy"))
            beta = await stack.enter_async_context(session(store, list_roots_callback=offering(BETA), mode="legacy"))
            desktop = await stack.enter_async_context(
                session(store, env={"MEMRL_NAMESPACE": "desktop", "MEMRL_TOOL_PROFILE": "core"})
            )
            task = "run the unit tests of this project"
            stored = {
                name: (await call(client, "store_experience", task=task, experience=name))["memory"]["namespace"]
                for name, client in (("alpha", alpha), ("beta", beta), ("desktop", desktop))
            }
            assert stored == {"alpha": project_namespace(ALPHA), "beta": project_namespace(BETA), "desktop": "desktop"}
            assert len((await desktop.list_tools()).tools) == 3  # core, where the others are offered every tool
            assert len((await alpha.list_tools()).tools) == 11
            recalled = await call(beta, "recall_experience", task=task)
            assert [memory["experience"] for memory in recalled["memories"]] == ["beta"]  # its project's only
    assert len(servers_of(store.runtime_dir)) == 1


async def test_the_inspectors_address_outlives_a_restart_of_the_server(store: LocalStore) -> None:
    """The address ``memrl-mcp local ui`` prints (its port and token) is the same after the server stopped and
    another started (issue 40.11: it changed with each restart, and a bookmarked page stopped opening); the file that
    keeps it is private to the user."""
    first = await anyio.to_thread.run_sync(lambda: store.local("ui"))
    assert first.returncode == 0, first.stderr
    assert store.local("stop").returncode == 0
    store.wait_gone()
    again = await anyio.to_thread.run_sync(lambda: store.local("ui"))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == first.stdout.strip()
    kept = store.place.folder / "ui.json"
    assert kept.stat().st_mode & 0o777 == 0o600


async def test_the_inspector_of_the_running_server_is_printed_and_served(store: LocalStore) -> None:
    """``memrl-mcp local ui`` prints an address with its token; with it the inspector answers, without it not."""
    import httpx

    async with session(store) as client:
        await call(client, "store_experience", task="index the wiki", experience="use the search API")
        printed = await anyio.to_thread.run_sync(lambda: store.local("ui"))
        assert printed.returncode == 0, printed.stderr
        url = printed.stdout.strip()
        base, token = url.split("/ui#token=")
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/ui/api/session")).status_code == 401
            answered = await http.get("/ui/api/memories", headers={"Authorization": f"Bearer {token}"})
            assert answered.status_code == 200, answered.text
            assert [memory["task"] for memory in answered.json()["memories"]] == ["index the wiki"]
        status = await anyio.to_thread.run_sync(lambda: store.local("status"))
        assert status.returncode == 0 and "1 session(s)" in status.stdout and url in status.stdout
    stopped = await anyio.to_thread.run_sync(lambda: store.local("stop"))
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert store.status() is None
    assert (await anyio.to_thread.run_sync(lambda: store.local("status"))).returncode == 1


async def test_another_store_gets_its_own_server_and_another_spelling_does_not(tmp_path: Path) -> None:
    with local_store(tmp_path, "one") as one, anyio.fail_after(START_S):
        other = LocalStore(tmp_path / "other", one.runtime_dir)
        (tmp_path / "link").symlink_to(tmp_path / "one")
        same = LocalStore(tmp_path / "link" / "." / ".." / "link", one.runtime_dir)  # the same folder
        async with session(one) as first:
            await call(first, "store_experience", task="water the plants", experience="twice a week")  # its folder
            async with session(other) as second, session(same) as third:
                assert (await call(second, "list_memories"))["memories"] == []
                assert [m["task"] for m in (await call(third, "list_memories"))["memories"]] == ["water the plants"]
                assert one.server_pid() != other.server_pid() and one.server_pid() == same.server_pid()
        assert len(servers_of(one.runtime_dir)) == 2


MODERN = {  # the 2026-07-28 envelope each request carries instead of a handshake
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "file", "version": "1"},
}


def opening(**capabilities: object) -> list[dict[str, Any]]:
    params = {
        "protocolVersion": "2025-11-25",
        "capabilities": capabilities,
        "clientInfo": {"name": "f", "version": "1"},
    }
    return [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]


def tool_call(request_id: int, name: str, **arguments: object) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def serve_to_the_end(store: LocalStore, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` written to an attached session's stdin, which is then closed; what it wrote by its exit."""
    lines = "".join(json.dumps(message) + "\n" for message in messages).encode()
    done = subprocess.run(
        CLI, input=lines, capture_output=True, env=store.env(), cwd=store.data_dir.parent, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_every_request_before_the_end_of_stdin_is_answered_through_the_relay(store: LocalStore, era: str) -> None:
    """A client that writes its requests and closes stdin at once gets every answer, each write made, in both
    protocol eras: the relay passes the end on, and the session in the server drains as a stdio server does."""
    requests = [tool_call(i, "store_experience", task=f"sort the mail of day {i}", experience=f"way {i}") for i in
                range(1, 21)]  # fmt: skip
    if era == "handshake":
        answers = serve_to_the_end(store, [*opening(), *requests])
    else:
        for request in requests:
            request["params"]["_meta"] = MODERN
        answers = [{"id": 0}, *serve_to_the_end(store, requests)]
    assert sorted(answer["id"] for answer in answers) == list(range(21))
    stats = serve_to_the_end(store, [*opening(), tool_call(1, "memory_stats")])[-1]
    assert stats["result"]["structuredContent"]["memories"] == 20


def test_a_cancelled_request_is_never_answered_through_the_relay(store: LocalStore) -> None:
    """A call asking the user, cancelled by the client: nobody answers it (neither the server nor the relay, which
    answers only the requests a server that died left), and it does not hold the session's end."""
    steps = [
        {"observation": "$ ls", "action": "cat notes", "reward": 0.0},
        {"observation": "(empty)", "action": "write"},
    ]
    report = tool_call(1, "report_trajectory", task="keep notes", steps=steps, episode_id="e-1")
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "gone"}}
    answers = serve_to_the_end(store, [*opening(elicitation={}), report, cancel, tool_call(2, "memory_stats")])
    assert [answer["id"] for answer in answers if "result" in answer or "error" in answer] == [0, 2], answers


HOOK = """
import json, sys
from memrl_mcp.local.client import LocalClient, ToolCallError
with LocalClient.open(roots=[sys.argv[1]]) as memory:
    found = memory.call_tool("recall_experience", {"task": "run the unit tests"})
heavy = sorted(name for name in ("mcp", "pydantic", "numpy", "anyio") if name in sys.modules)
print(json.dumps({"found": [m["experience"] for m in found["memories"]], "heavy": heavy}))
"""


def test_a_hook_reaches_the_shared_memory_from_a_fresh_process(store: LocalStore) -> None:
    """A short-lived process (a hook run at each prompt) starts the server when none runs, then reaches the memory
    through :class:`LocalClient`, in its project's namespace, loading none of the server's heavy modules."""
    env = store.env()
    first = python_with(HOOK.replace("LocalClient.open(", "LocalClient.open(start=True, "), env, ALPHA)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"found": [], "heavy": []}
    with LocalClient(attach(store.target).connection, roots=[ALPHA]) as memory:
        memory.call_tool("store_experience", {"task": "run the unit tests", "experience": "pytest -q"})
    again = python_with(HOOK, env, ALPHA)
    assert json.loads(again.stdout) == {"found": ["pytest -q"], "heavy": []}
    elsewhere = python_with(HOOK, env, BETA)  # another project's namespace
    assert json.loads(elsewhere.stdout)["found"] == []


def test_a_message_the_server_cannot_parse_is_answered_with_an_error(store: LocalStore) -> None:
    """A request whose text is not Unicode (a lone surrogate, which JSON can escape and the SDK's reader refuses) and
    a line that is not JSON at all: each is answered with a JSON-RPC parse error (with the request's id when it has
    one), where the SDK answered nothing and the client waited; the session goes on. A script's LocalClient gets the
    error at once, and a prompt hook cleans its prompt before sending it (tests/test_claude_code.py)."""
    lines = [json.dumps(message) for message in opening()]
    lines.append(json.dumps(tool_call(1, "recall_experience", task="deploy the \ud800 app")))
    lines += ["this is not JSON", json.dumps(tool_call(2, "memory_stats"))]
    done = subprocess.run(
        CLI, input="\n".join(lines).encode() + b"\n", capture_output=True, env=store.env(), cwd=store.data_dir.parent,
        timeout=300,
    )  # fmt: skip
    answers = {answer.get("id"): answer for answer in map(json.loads, done.stdout.decode().splitlines())}
    assert answers[1]["error"]["code"] == -32700 and "not valid Unicode" in answers[1]["error"]["message"], answers
    assert answers[None]["error"]["code"] == -32700 and "not JSON" in answers[None]["error"]["message"], answers
    assert answers[2]["result"]["structuredContent"]["memories"] == 0
    with LocalClient(attach(store.target).connection) as memory:
        with pytest.raises(ToolCallError, match="not valid Unicode"):
            memory.call_tool("recall_experience", {"task": "deploy the \udfff app"})
        assert memory.call_tool("memory_stats", {})["memories"] == 0
