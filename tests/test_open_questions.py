"""Questions to the client cannot pile up (memrl_mcp/surface/asking.py, OpenQuestions): of the reports of one recall
(or one episode_id), one at a time asks the user or the client's model, since only one can apply; and one token has
at most ``max_open_questions_per_token`` reports waiting for answers, without touching another token's. Through the
real MCP client and server, with real concurrent calls, in both protocol eras (the handshake protocols hold the
question in the call; 2026-07-28 ends the call with each question and the client comes back), in process and over
streamable HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import StatsQuery
from memrl_mcp.surface.server import create_server
from tests.support.mcp import Held, call, make_service, text_of
from tests.support.servers import ALICE, BOB, DEADLINE_S, http_server, mcp_client, tokens_file

pytestmark = pytest.mark.anyio

MODES = ["legacy", "auto"]  # the handshake protocol (today's clients); 2026-07-28 (this SDK's default)
TASK = "Renew the TLS certificate of the mail server"
CONCURRENT = 300


@asynccontextmanager
async def connect(service: MemoryService, mode: str, held: Held) -> AsyncIterator[Client]:
    async with Client(
        create_server(service), elicitation_callback=held.user, sampling_callback=held.model, mode=mode
    ) as client:
        yield client


async def all_at_once(client: Client, held: Held, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Make every call at once; once each has either asked the client or returned, release the answers."""
    results: list[Any] = [None] * len(calls)

    async def one(i: int, tool: str, arguments: dict[str, Any]) -> None:
        results[i] = await client.call_tool(tool, arguments)

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as group:
            for i, (tool, arguments) in enumerate(calls):
                group.start_soon(one, i, tool, arguments)
            while len(held.asked) + sum(r is not None for r in results) < len(calls):
                await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # a question that would still come, comes now
            held.release.set()
    return results


def refusals(results: list[Any]) -> list[str]:
    return [text_of(r) for r in results if r.is_error]


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_reports_of_one_recall_ask_the_user_once(service: MemoryService, mode: str) -> None:
    held = Held()
    async with connect(service, mode, held) as client:
        stored = await call(client, "store_experience", task=TASK, experience="certbot renew")
        recall = await call(client, "recall_experience", task=TASK)
        report = ("report_outcome", {"recall_id": recall["recall_id"], "experience": "renewed"})
        results = await all_at_once(client, held, [report] * CONCURRENT)
    assert len(held.asked) == 1
    busy = f"recall_id: another report of recall_id {recall['recall_id']!r} is waiting for the client's answer"
    refused = refusals(results)
    assert len(refused) == CONCURRENT - 1 and all(busy in message for message in refused)
    (applied,) = [r.structured_content for r in results if not r.is_error]
    assert (applied["reported"], applied["reward_source"]) == (True, "user")
    assert len(service.get(stored["id"], access=EVERYTHING).history) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_reports_of_one_recall_ask_the_clients_model_once(service: MemoryService, mode: str) -> None:
    """A reward given, the experience left to the client's model: of 300 reports of one recall, one asks the model
    (the sampling budget, 10 a minute, would have let 10 through, each held up to distill_timeout_seconds)."""
    held = Held()
    async with connect(service, mode, held) as client:
        await call(client, "store_experience", task=TASK, experience="certbot renew")
        recall = await call(client, "recall_experience", task=TASK)
        report = ("report_outcome", {"recall_id": recall["recall_id"], "reward": 1.0, "trajectory": "$ certbot renew"})
        results = await all_at_once(client, held, [report] * CONCURRENT)
    assert len(held.asked) == 1
    assert len(refusals(results)) == CONCURRENT - 1
    (applied,) = [r.structured_content for r in results if not r.is_error]
    assert applied["stored"]["memory"]["experience_source"] == "client_model"


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_reports_of_one_episode_ask_the_user_once(service: MemoryService, mode: str) -> None:
    held = Held()
    steps = [{"observation": "the certificate expires in 3 days", "action": "certbot renew"}]
    async with connect(service, mode, held) as client:
        report = ("report_trajectory", {"task": TASK, "steps": steps, "episode_id": "renewal-1"})
        other = ("report_trajectory", {"task": TASK, "steps": steps, "episode_id": "renewal-2"})
        results = await all_at_once(client, held, [report] * 50 + [other])
    assert len(held.asked) == 2  # one per episode_id
    busy = "episode_id: another report of episode_id 'renewal-1' is waiting for the client's answer"
    assert len(refusals(results)) == 49 and all(busy in message for message in refusals(results))
    assert service.stats(StatsQuery(), access=EVERYTHING).episodes_reported == 2


@pytest.mark.parametrize("mode", MODES)
async def test_a_token_has_at_most_its_open_questions(embedder: Embedder, tmp_path: Path, mode: str) -> None:
    service = make_service(embedder, tmp_path / "data", max_open_questions_per_token=3)
    held = Held()
    try:
        async with connect(service, mode, held) as client:
            recalls = []
            for i in range(10):
                await call(client, "store_experience", task=f"{TASK} number {i}", experience="certbot renew")
                recalls.append((await call(client, "recall_experience", task=f"{TASK} number {i}"))["recall_id"])
            results = await all_at_once(client, held, [("report_outcome", {"recall_id": r}) for r in recalls])
            assert len(held.asked) == 3
            limit = "reward: this token has 3 reports waiting for the client's answers (max_open_questions_per_token=3)"
            assert len(refusals(results)) == 7 and all(limit in message for message in refusals(results))
            # A report that gives what it would ask for asks nobody: never refused by the bound.
            assert (await call(client, "report_outcome", recall_id=recalls[-1], reward=1.0))["reported"] is True
    finally:
        service.close()


@pytest.mark.slow  # a server process
async def test_one_tokens_open_questions_do_not_lock_out_another_over_http(tmp_path: Path) -> None:
    """Streamable HTTP, 2026-07-28 (each question ends the call; the client comes back with the answer, carrying the
    report's conversation in the sealed state). alice holds her one place with a question her user does not answer
    yet; her next report is refused; bob's is asked."""
    variables = {"MEMRL_TOKENS_FILE": str(tokens_file(tmp_path)), "MEMRL_MAX_OPEN_QUESTIONS_PER_TOKEN": "1"}
    with http_server(tmp_path / "data", tmp_path, **variables) as server, anyio.fail_after(DEADLINE_S):
        alice_held, bob_held = Held(), Held()
        async with (
            mcp_client(server, ALICE, elicitation_callback=alice_held.user) as alice,
            mcp_client(server, BOB, elicitation_callback=bob_held.user) as bob,
        ):
            recalls = {}
            for name, client in (("alice", alice), ("bob", bob)):
                for i in range(2):
                    await call(client, "store_experience", task=f"{TASK} {i}", experience="certbot renew")
                    recall = await call(client, "recall_experience", task=f"{TASK} {i}")
                    recalls[name, i] = recall["recall_id"]
            async with anyio.create_task_group() as group:
                first: list[Any] = []

                async def report_first() -> None:
                    first.append(await call(alice, "report_outcome", recall_id=recalls["alice", 0]))

                group.start_soon(report_first)
                while not alice_held.asked:
                    await anyio.sleep(0.01)
                second = await alice.call_tool("report_outcome", {"recall_id": recalls["alice", 1]})
                assert second.is_error
                assert "(max_open_questions_per_token=1)" in text_of(second)
                bob_held.release.set()
                theirs = await call(bob, "report_outcome", recall_id=recalls["bob", 0])
                assert (theirs["reported"], theirs["reward_source"]) == (True, "user")
                alice_held.release.set()
            assert first[0]["reported"] is True
            # Her place is free again once her report is done.
            again = await call(alice, "report_outcome", recall_id=recalls["alice", 1])
            assert again["reward_source"] == "user"
        assert (len(alice_held.asked), len(bob_held.asked)) == (2, 1)
