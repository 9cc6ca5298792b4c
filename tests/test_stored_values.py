"""What a store holds that no read can use must never take a namespace's reads down, and ``memrl-mcp import`` lets no
such value in.

An import of an earlier version accepted a time past year 9999 (``created_at: 1e300``); every read of the namespace
then failed with a bare "Error executing tool". Other stored values a read formats or computes with can be as bad: a
payload written by another version or another replica (a Q as text, a null, an outcome or writer this version does
not know), a huge number, a damaged history. Here such records are written straight into the store, as that older
import or replica did, and every read path is taken through the real server process: the tools, the resources, the
/ui inspector's JSON API, /stats, and ``memrl-mcp export``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.records import memory_payload, step_id
from memrl_mcp.models import MemoryView, StepRecordView
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, new_id, open_store
from tests.support.mcp import call, make_service, resource_text
from tests.support.servers import (
    ALICE,
    DEADLINE_S,
    base_url,
    child_env,
    http_server,
    mcp_client,
    run_cli,
    tokens_file,
)

pytestmark = pytest.mark.anyio

TASK = "Deploy the web service to the staging cluster"
LAST_DATE = "9999-12-31T23:59:59.000000Z"
DAMAGED: dict[str, dict[str, Any]] = {
    "a time past 9999, as an earlier import let in": {"created_at": 1e300, "updated_at": 1e300},
    "the first second of year 10000": {"updated_at": 253_402_300_800.0},
    "a Q far beyond any reward": {"q": 1e300},
    "a Q as text": {"q": "high"},
    "a null Q": {"q": None},
    "visits as text": {"visits": "many"},
    "a visit count no integer type holds": {"visits": 1e30},
    "a last reward as text": {"last_reward": "good"},
    "metadata that is no object": {"metadata": "tags"},
    "a task that is no text": {"task": 42},
    "a writer a later version knows": {"experience_source": "a-later-writer"},
    "a Q history event of a later version": {"history": '[{"at": "yesterday", "event": "undo"}]'},
    "an outcome a later version knows, on the task recalled": {"outcome": "partial", "task": TASK},
}


def write_damaged_store(embedder: Embedder, data_dir: Path, engine: str) -> dict[str, str]:
    """A healthy memory, one memory per damage of :data:`DAMAGED` (its task a variant of :data:`TASK`), written
    straight into the store, and a step record of a time past 9999 written as an earlier import did (unchecked).
    Returns each memory's id by damage (the healthy one under "healthy")."""
    service = make_service(embedder, data_dir, engine)  # a fresh store at the current schema
    try:
        step = StepRecordView(
            id=step_id("alice", TASK, "the pods are pending"),
            namespace="alice",
            task=TASK,
            observation="the pods are pending",
            actions=[{"action": "kubectl describe pod", "q": 0.5, "visits": 1, "reward": 0.0}],
            created_at=1e300,
            updated_at=1e300,
        )
        with service.backup() as store:  # as written, past the import's checks (times past 9999 are refused)
            store.upsert("steps", service.steps.points("alice", [step]))
    finally:
        service.close()
    ids: dict[str, str] = {}
    points = []
    for i, (damage, fields) in enumerate({"healthy": {}, **DAMAGED}.items()):
        memory = MemoryView(
            id=new_id(),
            namespace="alice",
            task=f"{TASK}, case {i}",
            experience="kubectl apply -f staging.yaml, then watch the rollout",
            outcome="success",
            q=0.25,
            visits=2,
            last_reward=1.0,
            merges=0,
            created_at=1.8e9,
            updated_at=1.8e9,
            metadata={"case": i},
        )
        payload = {**memory_payload(memory), **fields}
        task = given if isinstance(given := fields.get("task"), str) else memory.task
        points.append(Point(memory.id, embedder.embed([task])[0], payload))
        ids[damage] = memory.id
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, embedder.dim)
    try:
        store.upsert("memories", points)
    finally:
        store.close()
    return ids


@pytest.mark.slow  # a server process, the export command
@pytest.mark.parametrize("engine", ["edge", "qdrant-local"])
async def test_a_stored_value_no_read_can_use_never_fails_a_read(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    data_dir = tmp_path / "data"
    ids = write_damaged_store(embedder, data_dir, engine)
    variables = {"MEMRL_TOKENS_FILE": str(tokens_file(tmp_path)), "MEMRL_EMBEDDED_ENGINE": engine}
    with http_server(data_dir, tmp_path, **variables) as server, anyio.fail_after(DEADLINE_S):
        async with mcp_client(server, ALICE) as client:
            listed = await call(client, "list_memories", limit=100)
            shown = {memory["id"]: memory for memory in listed["memories"]}
            assert set(shown) == set(ids.values()) and listed["total"] == len(ids)
            past = shown[ids["a time past 9999, as an earlier import let in"]]
            assert (past["created_at"], past["updated_at"]) == (LAST_DATE, LAST_DATE)
            assert shown[ids["the first second of year 10000"]]["updated_at"] == LAST_DATE
            assert shown[ids["a Q as text"]]["q"] == shown[ids["a null Q"]]["q"] == 0.0  # the neutral utility
            assert shown[ids["visits as text"]]["visits"] == 0
            assert shown[ids["a task that is no text"]]["task"] == "42"
            assert shown[ids["metadata that is no object"]]["metadata"] == {}
            assert shown[ids["a writer a later version knows"]]["experience_source"] is None
            assert shown[ids["an outcome a later version knows, on the task recalled"]]["outcome"] == "failure"
            healthy = shown[ids["healthy"]]
            assert (healthy["q"], healthy["visits"], healthy["metadata"]) == (0.25, 2, {"case": 0})

            wide = {"task": TASK, "k1": 100, "k2": 100, "delta": -1.0}
            recalled = await call(client, "recall_experience", **wide)
            assert {m["id"] for m in recalled["memories"]} == set(ids.values())
            searched = await call(client, "search_experience", **wide)
            assert {m["id"] for m in searched["memories"]} == set(ids.values())
            assert (await call(client, "memory_stats"))["memories"] == len(ids)
            advice = await call(client, "recall_step_advice", task=TASK, observation="the pods are pending")
            (record,) = advice["records"]
            assert record["created_at"] == LAST_DATE
            for memory_id in ids.values():
                resource = await client.read_resource(f"memrl://memories/{memory_id}")
                assert json.loads(resource_text(resource))["id"] == memory_id
            stats = await client.read_resource("memrl://stats/alice")
            assert json.loads(resource_text(stats))["memories"] == len(ids)
            # The report of that recall still works: the damaged memories' Q move like any other.
            report = await call(client, "report_outcome", recall_id=recalled["recall_id"], reward=1.0)
            assert len(report["updated"]) == len(ids)

        base, bearer = base_url(server), {"Authorization": f"Bearer {ALICE}"}
        async with httpx.AsyncClient(base_url=base, headers=bearer, timeout=DEADLINE_S) as http:
            for path in ("/stats", "/ui/api/session", "/ui/api/stats", "/ui/api/memories?limit=100"):
                answer = await http.get(path)
                assert answer.status_code == 200, (path, answer.text)
            for memory_id in ids.values():
                answer = await http.get(f"/ui/api/memories/{memory_id}")
                assert answer.status_code == 200, answer.text
            preview = await http.post("/ui/api/preview", json=wide)
            assert preview.status_code == 200, preview.text
            assert len(preview.json()["candidates"]) == len(ids)
        assert "holds values no read can use" in server.log_path.read_text()  # the operator is told

    backup = tmp_path / "backup.jsonl"
    env = child_env(MEMRL_EMBEDDED_ENGINE=engine)
    exported = run_cli("export", "--out", str(backup), "--data-dir", str(data_dir), env=env, timeout=120)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in backup.read_text().splitlines()]
    assert sorted(line["id"] for line in lines if line["kind"] == "memory") == sorted(ids.values())
    assert [line["created_at"] for line in lines if line["kind"] == "step"] == [1e300]


@pytest.mark.slow  # the import command
async def test_an_import_of_a_time_no_date_can_show_is_refused_by_name(embedder: Embedder, tmp_path: Path) -> None:
    """``memrl-mcp import`` refuses a time past 9999 as it refuses a negative one, in memories and step records, and
    writes nothing."""
    memory = MemoryView(
        id=new_id(),
        namespace="alice",
        task=TASK,
        experience="kubectl apply -f staging.yaml",
        outcome="success",
        q=0.0,
        visits=0,
        last_reward=None,
        merges=0,
        created_at=1.8e9,
        updated_at=1.8e9,
        metadata={},
    )
    step = {
        "kind": "step",
        "id": step_id("alice", TASK, "the pods are pending"),
        "namespace": "alice",
        "task": TASK,
        "observation": "the pods are pending",
        "actions": [{"action": "kubectl describe pod", "q": 0.5, "visits": 1, "reward": 0.0}],
        "created_at": 1.8e9,
        "updated_at": 1e300,
    }
    lines = [
        {**memory.model_dump(), "created_at": 1e300},
        {**memory.model_dump(), "id": new_id(), "updated_at": 253_402_300_800.0},
        {**memory.model_dump(), "id": new_id(), "created_at": -1.0},
        step,
        {**memory.model_dump(), "id": new_id(), "updated_at": 253_402_300_799.0},  # 9999-12-31T23:59:59Z: fine
    ]
    backup = tmp_path / "backup.jsonl"
    backup.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_cli("import", str(backup), "--data-dir", str(tmp_path / "data"), env=child_env())
    assert done.returncode == 2, done.stderr
    assert "4 bad line(s), nothing imported" in done.stderr
    after = "is after 9999-12-31T23:59:59Z (Unix time 253402300799), the last time a date shows"
    assert f"line 1: created_at: {after}, got 1e+300" in done.stderr
    assert f"line 2: updated_at: {after}, got 253402300800.0" in done.stderr
    assert "line 3: created_at: Input should be greater than or equal to 0" in done.stderr
    assert f"line 4: updated_at: {after}, got 1e+300" in done.stderr
    assert "line 5" not in done.stderr and "Traceback" not in done.stderr
    service = make_service(embedder, tmp_path / "data")
    try:
        assert list(service.memories()) == [] and list(service.step_records()) == []
    finally:
        service.close()
