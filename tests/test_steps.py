"""The step memory (Rememberer) through the real MCP client and server, on both embedded engines: advice,
trajectory reports applied once per episode_id, hostile inputs, tenants, crashes and backups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import StatsQuery, StepQuery, TrajectoryReport
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, hints, make_service, refused
from tests.support.servers import ALICE, BOB, DEADLINE_S, http_server, mcp_client, tokens_file
from tests.support.steps import COUNTER, HOLDING, MUG, ROOM, SUCCESS, records, steps_of, trajectory_of

pytestmark = pytest.mark.anyio

KNIFE = "You pick up the knife 1 from the countertop 1."


FAILURE = trajectory_of(
    (ROOM, "go to countertop 1", 0.0),
    (COUNTER, "take knife 1 from countertop 1", 0.0),
    (KNIFE, "go to coffeemachine 1", -1.0),
)


def advised(advice: dict[str, Any], kind: str) -> list[tuple[str, float, int]]:
    return [(a["action"], a["q"], a["visits"]) for a in advice[kind]]


async def test_reports_change_the_advice(client: Client) -> None:
    """Defaults: n = 1, gamma = 1, Q the running mean of its targets, steps credited last to first. Hand-computed:
    e-1 (success): G_2 = 1 -> Q(HOLDING, sink) = 1; G_1 = 0 + max Q(HOLDING) = 1; G_0 = 0 + max Q(COUNTER) = 1.
    e-2 (failure): G_2 = -1 -> Q(KNIFE, coffee) = -1; G_1 = 0 + max Q(KNIFE) = -1 -> Q(COUNTER, knife) = -1;
    G_0 = 0 + max Q(COUNTER) = max(1, -1) = 1: going to the counter was right, the knife was the mistake.
    e-3 (success): every target 1; Q(COUNTER, mug) = mean(1, 1) = 1, Q(ROOM, go) = mean(1, 1, 1) = 1."""
    empty = await call(client, "recall_step_advice", task=MUG, observation=COUNTER)
    assert empty["encouraged"] == [] and empty["discouraged"] == [] and empty["records"] == []

    first = await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e-1")
    assert (first["already_applied"], first["steps"], first["updated"], first["created"]) == (False, 3, 3, 3)
    assert [(c["target"], c["q_before"], c["q_after"]) for c in first["changes"]] == [
        (1.0, None, 1.0),
        (1.0, None, 1.0),
        (1.0, None, 1.0),
    ]
    second = await call(client, "report_trajectory", task=MUG, steps=FAILURE, episode_id="e-2")
    assert (second["updated"], second["created"], second["merged"]) == (3, 1, 1)  # (ROOM, go) merged
    assert [(c["target"], c["q_after"]) for c in second["changes"]] == [(1.0, 1.0), (-1.0, -1.0), (-1.0, -1.0)]
    third = await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e-3")
    assert (third["updated"], third["created"], third["merged"]) == (3, 0, 3)
    assert [(c["target"], c["q_after"], c["visits"]) for c in third["changes"]] == [
        (1.0, 1.0, 3),
        (1.0, 1.0, 2),
        (1.0, 1.0, 2),
    ]

    advice = await call(client, "recall_step_advice", task=MUG, observation=COUNTER, k=1)
    (record,) = advice["records"]
    assert record["observation"] == COUNTER and record["task"] == MUG
    for key in ("similarity", "task_similarity", "observation_similarity"):
        assert record[key] == pytest.approx(1.0, abs=1e-5)
    assert advised(advice, "encouraged") == [("take mug 1 from countertop 1", 1.0, 2)]
    assert advised(advice, "discouraged") == [("take knife 1 from countertop 1", -1.0, 1)]
    assert advice["advice_threshold"] == 0.0
    after_knife = await call(client, "recall_step_advice", task=MUG, observation=KNIFE, k=1)
    assert advised(after_knife, "discouraged") == [("go to coffeemachine 1", -1.0, 1)]


def test_forward_credit_is_rememberers_order(embedder: Embedder, tmp_path: Path) -> None:
    """``step_order: forward`` reads every tail from the memory as it stood before the episode (Rememberer's code):
    the first success leaves its early steps at Q 0, discouraged; the reward reaches the counter one episode later:
    e-2's G_1 = 0 + max Q(HOLDING) = 1 -> Q(COUNTER, mug) = mean(0, 1) = 0.5."""
    service = make_service(embedder, tmp_path, step_order="forward")
    try:
        first = service.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e-1"), access=EVERYTHING)
        assert [(c.target, c.q_after) for c in first.changes] == [(0.0, 0.0), (0.0, 0.0), (1.0, 1.0)]
        advice = service.recall_step_advice(StepQuery(MUG, COUNTER, k=1), access=EVERYTHING)
        assert [a.action for a in advice.discouraged] == ["take mug 1 from countertop 1"] and not advice.encouraged
        second = service.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e-2"), access=EVERYTHING)
        assert [(c.target, c.q_after) for c in second.changes] == [(0.0, 0.0), (1.0, 0.5), (1.0, 1.0)]
    finally:
        service.close()


async def test_an_episode_id_is_applied_once_and_its_recall_with_it(client: Client, service: MemoryService) -> None:
    stored = await call(client, "store_experience", task=MUG, experience="rinse the mug first")
    recall = await call(client, "recall_experience", task=MUG)
    first = await call(
        client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="run-7", recall_id=recall["recall_id"]
    )
    assert first["updated"] == 3 and first["outcome_error"] is None
    # The episode memory's report of that recall, with the last step's reward (1.0): Q <- 0 + 0.3 (1 - 0).
    (change,) = first["outcome"]["updated"]
    assert (change["id"], change["q_after"], change["visits"]) == (stored["id"], pytest.approx(0.3), 1)
    before = records(service)

    again = await call(
        client, "report_trajectory", task=MUG, steps=FAILURE, episode_id="run-7", recall_id=recall["recall_id"]
    )
    assert again["already_applied"] is True and again["changes"] == [] and again["outcome"] is None
    assert "already reported" in again["message"] and again["updated"] == 3
    assert records(service) == before
    memory = service.get(stored["id"], access=EVERYTHING)
    assert (memory.q, memory.visits) == pytest.approx((0.3, 1))
    # The recall itself is spent: report_outcome says so.
    assert "already reported" in await refused(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    # Another namespace has its own episode ids.
    other = await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="run-7", namespace="lab")
    assert other["already_applied"] is False and other["created"] == 3


async def test_a_spent_or_foreign_recall_id_is_refused_before_anything_is_written(
    client: Client, service: MemoryService
) -> None:
    recall = await call(client, "recall_experience", task=MUG)
    await call(client, "report_outcome", recall_id=recall["recall_id"], reward=0.0)
    for recall_id, says in ((recall["recall_id"], "already reported"), ("not-a-recall", "unknown recall")):
        message = await refused(
            client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e", recall_id=recall_id
        )
        assert message.startswith("recall_id:") or "recall_id:" in message
        assert says in message
    assert records(service) == {} and service.stats(StatsQuery(), access=EVERYTHING).episodes_reported == 0


async def test_concurrent_duplicates_from_several_clients_apply_once(service: MemoryService) -> None:
    server = create_server(service)
    results: list[dict[str, Any]] = []

    async def report(episode_id: str) -> None:
        async with Client(server) as client:
            results.append(await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id=episode_id))

    async with anyio.create_task_group() as group:
        for _ in range(6):
            group.start_soon(report, "same-episode")
    assert sorted(r["already_applied"] for r in results) == [False] + [True] * 5
    assert all(a["visits"] == 1 for r in records(service).values() for a in r["actions"])

    # Distinct episodes racing on the same records: none is lost.
    results.clear()
    async with anyio.create_task_group() as group:
        for i in range(6):
            group.start_soon(report, f"episode-{i}")
    assert [r["already_applied"] for r in results] == [False] * 6
    visits = sorted(a["visits"] for r in records(service).values() for a in r["actions"])
    assert visits == [7, 7, 7]
    holding = service.recall_step_advice(StepQuery(MUG, HOLDING, k=1), access=EVERYTHING)
    assert [(a.action, a.q) for a in holding.encouraged] == [("go to sinkbasin 1", 1.0)]


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"steps": []}, "steps"),
    ({"steps": SUCCESS * 100}, "steps"),  # 300 > max_trajectory_steps = 200
    ({"steps": [{**SUCCESS[0], "observation": "x" * 8001}]}, "observation"),
    ({"steps": [{**SUCCESS[0], "observation": "   "}]}, "observation"),
    ({"steps": [{**SUCCESS[0], "action": "a" * 1001}]}, "action"),
    ({"steps": [{**SUCCESS[0], "reward": "NaN"}]}, "reward"),
    ({"steps": [{**SUCCESS[0], "reward": "Infinity"}]}, "reward"),
    ({"steps": [{**SUCCESS[0], "reward": 1.5}]}, "reward"),
    ({"steps": [{**SUCCESS[0], "reward": "1"}]}, "reward"),
    ({"steps": [{**SUCCESS[0], "action": 5}]}, "action"),
    ({"steps": [{"observation": ROOM, "action": "look"}]}, "reward"),
    ({"steps": [{**SUCCESS[0], "comment": "extra"}]}, "comment"),
    ({"steps": "go to countertop 1"}, "steps"),
    ({"episode_id": ""}, "episode_id"),
    ({"episode_id": "e" * 201}, "episode_id"),
    ({"episode_id": 7}, "episode_id"),
    ({"namespace": "no spaces"}, "namespace"),
    ({"recall_id": 5}, "recall_id"),
    ({"recall_id": "r" * 10_000}, "recall_id"),
    ({"surprise": True}, "surprise"),
]


@pytest.mark.parametrize(("changes", "named"), HOSTILE)
async def test_hostile_reports_are_refused_by_name_and_change_nothing(
    client: Client, service: MemoryService, changes: dict[str, Any], named: str
) -> None:
    await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="kept")
    before = records(service)
    message = await refused(client, "report_trajectory", **{"task": MUG, "steps": SUCCESS, "episode_id": "e"} | changes)
    assert named in message
    assert records(service) == before
    assert service.stats(StatsQuery(), access=EVERYTHING).episodes_reported == 1
    # The refused episode id was not spent.
    assert (await call(client, "report_trajectory", task=MUG, steps=FAILURE, episode_id="e"))["updated"] == 3


async def test_advice_inputs_are_bounded(client: Client) -> None:
    assert "observation" in await refused(client, "recall_step_advice", task=MUG, observation="x" * 8001)
    assert "k" in await refused(client, "recall_step_advice", task=MUG, observation=ROOM, k=0)
    assert "task" in await refused(client, "recall_step_advice", task="", observation=ROOM)
    assert "extra" in await refused(client, "recall_step_advice", task=MUG, observation=ROOM, extra=1)


def test_the_python_api_is_as_strict(service: MemoryService) -> None:
    for reward, says in ((float("nan"), "finite"), (True, "valid number"), ("0.5", "valid number")):
        steps = [{**SUCCESS[0], "reward": reward}]
        with pytest.raises(MemoryRequestError, match=rf"steps\[0\]\.reward: .*{says}"):
            service.report_trajectory(TrajectoryReport(MUG, steps, "e"), access=EVERYTHING)  # type: ignore[arg-type]
    with pytest.raises(MemoryRequestError, match=r"steps\[1\]\.observation: .*8000"):
        service.report_trajectory(
            TrajectoryReport(MUG, steps_of([SUCCESS[0], {**SUCCESS[1], "observation": "y" * 9000}]), "e"),
            access=EVERYTHING,
        )
    with pytest.raises(TypeError, match="access"):
        service.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e"))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="access"):
        service.recall_step_advice(StepQuery(MUG, ROOM))  # type: ignore[call-arg]
    assert records(service) == {}


async def test_a_long_observation_is_matched_by_its_head_and_tail(client: Client, service: MemoryService) -> None:
    middle = " ".join(f"line {i}: total 0 drwxr-xr-x root root" for i in range(150))
    listing = f"$ ls -la /srv/app\n{middle}\n$ "
    assert len(listing) > 5000
    steps = [{"observation": listing, "action": "cat /srv/app/config.yaml", "reward": 1.0}]
    await call(client, "report_trajectory", task="find the app's port", steps=steps, episode_id="long")
    same = await call(client, "recall_step_advice", task="find the app's port", observation=listing, k=1)
    assert same["records"][0]["observation"] == listing  # the whole text is kept and keys the record
    assert same["records"][0]["observation_similarity"] == pytest.approx(1.0, abs=1e-5)
    # Another middle, same head and tail: the same embedding, but another record (the key is the whole text).
    other = listing.replace("line 75:", "line 75 changed:")
    report = await call(
        client,
        "report_trajectory",
        task="find the app's port",
        steps=[{**steps[0], "observation": other}],
        episode_id="long-2",
    )
    assert report["created"] == 1
    advice = await call(client, "recall_step_advice", task="find the app's port", observation=other, k=2)
    assert [r["observation_similarity"] for r in advice["records"]] == [pytest.approx(1.0, abs=1e-5)] * 2
    assert len(records(service)) == 2


async def test_capacities_bound_actions_and_records(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path, step_max_actions=2, step_max_records=3)
    try:
        async with Client(create_server(service)) as client:
            kept = []
            for i, (action, reward) in enumerate((("a", 0.5), ("b", -1.0), ("c", 0.2), ("d", -0.5))):
                steps = [{"observation": ROOM, "action": action, "reward": reward}]
                report = await call(client, "report_trajectory", task=MUG, steps=steps, episode_id=f"act-{i}")
                kept.append(report["changes"][0]["kept"])
            (record,) = records(service).values()
            # c pushed out b (the lowest mean reward); d came in with the lowest and went at once.
            assert [a["action"] for a in record["actions"]] == ["a", "c"]
            assert kept == [True, True, True, False]

            # Three more distinct steps: the fourth record makes room by the paper's rule. COUNTER and HOLDING are
            # the closest stored pair (0.875 with MiniLM), and KNIFE is farther from each stored record (0.870 at
            # most) than they are from each other: KNIFE stays, and of the pair the one with more samples (HOLDING,
            # visited twice) goes.
            for i, observation in enumerate((COUNTER, HOLDING, HOLDING, KNIFE)):
                steps = [{"observation": observation, "action": "look", "reward": 0.0}]
                report = await call(client, "report_trajectory", task=MUG, steps=steps, episode_id=f"rec-{i}")
                assert (report["created"], report["merged"], report["dropped"]) == (int(i != 2), int(i == 2), 0)
            assert {r["observation"] for r in records(service).values()} == {ROOM, COUNTER, KNIFE}
            # A near-copy of a stored record adds the least: it is the one dropped, and nothing else changes.
            before = records(service)
            steps = [{"observation": KNIFE.replace(".", "!"), "action": "look", "reward": 0.0}]
            report = await call(client, "report_trajectory", task=MUG, steps=steps, episode_id="near-copy")
            assert (report["updated"], report["created"], report["dropped"]) == (0, 0, 1)
            assert records(service) == before
            assert (await call(client, "memory_stats"))["steps"] == 3
    finally:
        service.close()


async def test_forget_removes_a_namespaces_steps_and_episodes(client: Client, service: MemoryService) -> None:
    await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e", namespace="gone")
    await call(client, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="e", namespace="kept")
    stats = await call(client, "memory_stats", namespace="gone")
    assert (stats["steps"], stats["episodes_reported"]) == (3, 1)
    forgotten = await call(client, "forget_experience", namespace="gone")
    assert forgotten["steps_deleted"] == 3
    stats = await call(client, "memory_stats", namespace="gone")
    assert (stats["steps"], stats["episodes_reported"]) == (0, 0)
    assert (await call(client, "memory_stats", namespace="kept"))["steps"] == 3
    advice = await call(client, "recall_step_advice", task=MUG, observation=COUNTER, namespace="gone")
    assert advice["records"] == []


@pytest.mark.slow  # a server process
async def test_a_tenant_never_sees_or_updates_another_tenants_steps(tmp_path: Path) -> None:
    with (
        http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tokens_file(tmp_path))) as server,
        anyio.fail_after(DEADLINE_S),
    ):
        async with mcp_client(server, ALICE) as alice, mcp_client(server, BOB) as bob:
            mine = await call(alice, "report_trajectory", task=MUG, steps=SUCCESS, episode_id="run-1")
            assert (mine["namespace"], mine["created"]) == ("alice", 3)
            alice_recall = await call(alice, "recall_experience", task=MUG)

            for namespace in (None, "bob", "shared"):
                advice = await call(bob, "recall_step_advice", task=MUG, observation=COUNTER, namespace=namespace)
                assert advice["records"] == [] and advice["encouraged"] == []
            for tool, arguments in (
                ("recall_step_advice", {"task": MUG, "observation": COUNTER}),
                ("report_trajectory", {"task": MUG, "steps": FAILURE, "episode_id": "run-1"}),
                ("forget_experience", {}),
            ):
                message = await refused(bob, tool, namespace="alice", **arguments)
                assert "not one of the namespaces this token may use" in message
            # Alice's recall looks like one that does not exist, and nothing of bob's report is written.
            message = await refused(
                bob, "report_trajectory", task=MUG, steps=FAILURE, episode_id="x", recall_id=alice_recall["recall_id"]
            )
            assert "unknown recall" in message
            # The same episode id is bob's own in his namespace: applied there, alice's steps untouched.
            his = await call(bob, "report_trajectory", task=MUG, steps=FAILURE, episode_id="run-1")
            assert (his["namespace"], his["already_applied"], his["created"]) == ("bob", False, 3)

            advice = await call(alice, "recall_step_advice", task=MUG, observation=COUNTER, k=3)
            assert {r["namespace"] for r in advice["records"]} == {"alice"}
            seen = [(a["action"], a["visits"]) for r in advice["records"] for a in r["actions"]]
            assert ("take mug 1 from countertop 1", 1) in seen
            assert all(visits == 1 for _, visits in seen)  # bob's report added no visit
            assert not {a for a, _ in seen} & {step["action"] for step in FAILURE[1:]}  # nor any of his actions
            assert (await call(alice, "memory_stats"))["steps"] == 3
            assert (await call(bob, "memory_stats"))["steps"] == 3


def test_n_step_targets_and_the_constant_rate_through_the_service(embedder: Embedder, tmp_path: Path) -> None:
    """n = 2, gamma = 0.5, Q <- Q + 0.5 (G - Q), credited last to first, by hand:
    e-1: G_2 = 1 -> Q(HOLDING) = 0.5; G_1 = 0 + 0.5 x 1 = 0.5 (t + n past the end) -> Q(COUNTER) = 0.25;
    G_0 = 0 + 0.5 x 0 + 0.25 x max Q(HOLDING) = 0.125 -> Q(ROOM) = 0.0625.
    e-2: G_2 = 1 -> 0.75; G_1 = 0.5 -> 0.375; G_0 = 0.25 x max Q(HOLDING) after G_2's fold (0.75) = 0.1875 ->
    0.0625 + 0.5 (0.1875 - 0.0625) = 0.125."""
    service = make_service(embedder, tmp_path, step_n=2, step_gamma=0.5, step_update="const", step_learning_rate=0.5)
    try:
        first = service.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e-1"), access=EVERYTHING)
        assert [(c.target, c.q_after) for c in first.changes] == [(0.125, 0.0625), (0.5, 0.25), (1.0, 0.5)]
        second = service.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e-2"), access=EVERYTHING)
        assert [(c.target, c.q_before, c.q_after) for c in second.changes] == [
            (0.1875, 0.0625, 0.125),
            (0.5, 0.25, 0.375),
            (1.0, 0.5, 0.75),
        ]
    finally:
        service.close()


def test_the_tail_comes_from_the_nearest_record_above_the_threshold(service: MemoryService) -> None:
    service.report_trajectory(
        TrajectoryReport(MUG, steps_of(SUCCESS), "e-1"), access=EVERYTHING
    )  # Q(HOLDING, go to sinkbasin 1) = 1
    near = "You pick up the mug 1 from the countertop 1 ."  # not the same text: no exact record
    far = "Nothing happens."
    for episode, observation, tail in (("near", near, 1.0), ("far", far, 0.0)):
        steps = [
            {"observation": ROOM, "action": "take mug 1", "reward": 0.0},
            {"observation": observation, "action": "wait", "reward": 0.0},  # its own record's best: Q 0
        ]
        report = service.report_trajectory(TrajectoryReport(MUG, steps_of(steps), episode), access=EVERYTHING)
        # 0 + gamma x the best of the observation's own record (0) and the matched record's max Q (1), if any
        assert report.changes[0].target == tail, observation
        assert report.created == 1  # the near observation is a record of its own all the same


async def test_the_schemas_tell_clients_the_bounds(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert hints(tools["recall_step_advice"]).read_only_hint is True
    assert hints(tools["report_trajectory"]).idempotent_hint is True
    report = tools["report_trajectory"].input_schema
    assert report["additionalProperties"] is False
    assert (report["properties"]["steps"]["minItems"], report["properties"]["steps"]["maxItems"]) == (1, 200)
    step = report["$defs"]["TrajectoryStep"]
    # The reward may be left out (the last step's: the server asks the user), so it is not required.
    assert step["additionalProperties"] is False and step["required"] == ["observation", "action"]
    assert step["properties"]["observation"]["maxLength"] == 8000
    assert (step["properties"]["reward"]["minimum"], step["properties"]["reward"]["maximum"]) == (-1.0, 1.0)
