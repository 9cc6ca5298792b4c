"""A store's schema is versioned and migrated on open: old memories become updatable, a migration killed midway
completes at the next open, and a store of a newer schema is refused untouched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.records import operation_token
from memrl_mcp.models import QEvent
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, new_id, open_store
from memrl_mcp.storage.migrations import SCHEMA_POINT, SCHEMA_VERSION, schema_version
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, make_service, refused, resource_text
from tests.support.stores import TASKS, old_payload, write_old_store


def old_fields_left(data_dir: Path, engine: str = "edge") -> tuple[int, int]:
    """(memories still without ``version``, schema version recorded), read from the closed store."""
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
    try:
        return store.count("memories", {"version": None}), schema_version(store)
    finally:
        store.close()


@pytest.mark.anyio
async def test_an_old_format_store_opens_and_its_memories_learn_again(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    data_dir = tmp_path / "data"
    vectors = embedder.embed(list(TASKS))
    points = [Point(new_id(), v, old_payload("team", t)) for t, v in zip(TASKS, vectors, strict=True)]
    write_old_store(data_dir, engine, points)
    assert old_fields_left(data_dir, engine) == (3, 0)

    service = make_service(embedder, data_dir, engine)
    try:
        async with Client(create_server(service)) as client:
            recalled = await call(client, "recall_experience", task=TASKS[0], namespace="team")
            ids = [m["id"] for m in recalled["memories"]]
            assert points[0].id in ids
            report = await call(client, "report_outcome", recall_id=recalled["recall_id"], reward=1.0)
            changed = {c["id"]: c for c in report["updated"]}
            assert set(changed) == set(ids)  # every recalled old memory was updated, none missing
            assert report["missing"] == []
            assert changed[points[0].id]["q_before"] == 0.25
            assert changed[points[0].id]["q_after"] == pytest.approx(0.25 + 0.3 * (1.0 - 0.25))
            assert changed[points[0].id]["visits"] == 3
            stored = await call(client, "memory_stats", namespace="team")
            assert stored["visits"] == 2 * 3 + len(ids)
    finally:
        service.close()
    assert old_fields_left(data_dir, engine) == (0, SCHEMA_VERSION)


def test_a_fresh_store_records_its_schema_and_a_reopen_changes_nothing(embedder: Embedder, tmp_path: Path) -> None:
    make_service(embedder, tmp_path / "data").close()
    assert old_fields_left(tmp_path / "data") == (0, SCHEMA_VERSION)
    make_service(embedder, tmp_path / "data").close()
    assert old_fields_left(tmp_path / "data") == (0, SCHEMA_VERSION)


@pytest.mark.anyio
async def test_a_version_1_store_gets_its_q_histories_as_text_and_they_go_on(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    data_dir = tmp_path / "data"
    event = {"at": 1.7e9, "event": "reward", "reward": 1.0, "q_before": 0.0, "q_after": 0.25, "recall_id": None}
    payload = {**old_payload("team", TASKS[0]), "version": 1, "applied": ["report:x"], "history": [event]}
    point = Point(new_id(), embedder.embed([TASKS[0]])[0], payload)
    write_old_store(data_dir, engine, [point])
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
    store.upsert("recalls", [Point(SCHEMA_POINT, np.eye(1, 384, dtype=np.float32)[0], {"schema_version": 1})])
    store.close()

    def stored_history() -> Any:
        store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
        try:
            assert schema_version(store) == SCHEMA_VERSION == 5
            return store.get("memories", [point.id])[point.id]["history"]
        finally:
            store.close()

    make_service(embedder, data_dir, engine).close()  # the open migrates
    assert stored_history() == json.dumps([event])

    service = make_service(embedder, data_dir, engine)
    try:
        async with Client(create_server(service)) as client:
            recalled = await call(client, "recall_experience", task=TASKS[0], namespace="team")
            await call(client, "report_outcome", recall_id=recalled["recall_id"], reward=1.0)
            read = await client.read_resource(f"memrl://memories/{point.id}")
            history = json.loads(resource_text(read))["history"]
    finally:
        service.close()
    assert [e["q_after"] for e in history] == [0.25, pytest.approx(0.25 + 0.3 * 0.75)]
    stored = [QEvent.model_validate(event).model_dump(mode="json") for event in json.loads(stored_history())]
    assert stored == history  # the stored floats, with their times in ISO 8601 as every answer shows them


@pytest.mark.anyio
async def test_a_version_4_store_opens_with_every_q_history_whole(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """A version-4 memory holds its whole history (50 events, one per line) in its payload: read as the tail of
    version 5, it shows whole, and its next update moves it to the history table without losing an event."""
    data_dir = tmp_path / "data"
    events = [
        {"at": 1.7e9 + i, "event": "reward", "reward": 0.5, "q_before": i / 100, "q_after": (i + 1) / 100,
         "recall_id": f"r{i}", "source": "agent", "note": None}
        for i in range(50)
    ]  # fmt: skip
    history = "[" + ",\n".join(json.dumps(event) for event in events) + "]"
    payload = {**old_payload("team", TASKS[0], q=0.5), "version": 60, "applied": "q:r58 q:r59", "history": history}
    point = Point(new_id(), embedder.embed([TASKS[0]])[0], payload)
    write_old_store(data_dir, engine, [point])
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
    store.upsert("recalls", [Point(SCHEMA_POINT, np.eye(1, 384, dtype=np.float32)[0], {"schema_version": 4})])
    store.close()
    shown = [QEvent.model_validate(event).model_dump(mode="json") for event in events]

    service = make_service(embedder, data_dir, engine)
    try:
        async with Client(create_server(service)) as client:
            read = await client.read_resource(f"memrl://memories/{point.id}")
            assert json.loads(resource_text(read))["history"] == shown
            recalled = await call(client, "recall_experience", task=TASKS[0], namespace="team")
            await call(client, "report_outcome", recall_id=recalled["recall_id"], reward=1.0)
            read = await client.read_resource(f"memrl://memories/{point.id}")
            after = json.loads(resource_text(read))["history"]
            assert after[:-1] == shown[1:] and after[-1]["recall_id"] == recalled["recall_id"]
            assert after[-1]["q_before"] == 0.5
        assert schema_version(service._store) == SCHEMA_VERSION == 5
        assert service._store.count("history", {"memory": point.id}) == 1  # the old history, one chunk
    finally:
        service.close()


def test_memories_two_versions_behind_get_both_steps_in_one_pass(embedder: Embedder, tmp_path: Path) -> None:
    """A version-0 memory (no bookkeeping) holding a Q history as a list gets both steps, in the single pass over
    the memories a migration makes; the other memories keep what they hold."""
    data_dir = tmp_path / "data"
    event = {"at": 1.7e9, "event": "reward", "reward": 1.0, "q_before": 0.0, "q_after": 0.25, "recall_id": None}
    both = Point(new_id(), embedder.embed([TASKS[0]])[0], {**old_payload("team", TASKS[0]), "history": [event]})
    current = Point(new_id(), embedder.embed([TASKS[1]])[0], memory_payload_of("team", TASKS[1]))
    write_old_store(data_dir, "edge", [both, current])

    make_service(embedder, data_dir).close()
    store = open_store(load_settings(data_dir=data_dir).storage, 384)
    try:
        stored = store.get("memories", [both.id, current.id])
        assert schema_version(store) == SCHEMA_VERSION
    finally:
        store.close()
    assert stored[both.id] == {**both.payload, "version": 0, "applied": [], "history": json.dumps([event])}
    assert stored[current.id] == current.payload


def memory_payload_of(namespace: str, task: str) -> dict[str, Any]:
    """A memory as this version stores it."""
    return {**old_payload(namespace, task), "version": 4, "applied": ["report:a"]}


@pytest.mark.slow  # a child process
def test_a_migration_killed_midway_completes_at_the_next_open(embedder: Embedder, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    rng = np.random.default_rng(0)
    n = 20_000
    vectors = rng.standard_normal((n, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    points = [Point(new_id(), v, old_payload("bulk", f"task {i}")) for i, v in enumerate(vectors)]
    write_old_store(data_dir, "edge", points)

    # The real server migrates at start-up and logs its progress; kill it (SIGKILL) at the first progress line.
    server = subprocess.Popen(
        [sys.executable, "-m", "memrl_mcp.cli", "--data-dir", str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MEMRL_LOG_FORMAT": "text"},
    )
    assert server.stderr is not None
    try:
        deadline = time.monotonic() + 120
        for line in server.stderr:
            if "schema migration:" in line or time.monotonic() > deadline:
                break
        server.send_signal(signal.SIGKILL)
    finally:
        server.kill()
        server.wait()
    left, version = old_fields_left(data_dir)
    assert 0 < left < n, f"the kill did not land mid-migration ({left} of {n} memories left)"
    assert version == 0  # not recorded: the migration did not finish

    service = make_service(embedder, data_dir)
    service.close()
    assert old_fields_left(data_dir) == (0, SCHEMA_VERSION)


@pytest.mark.slow  # a child process
def test_a_store_of_a_newer_schema_is_refused_untouched(embedder: Embedder, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    write_old_store(data_dir, "edge", [Point(new_id(), embedder.embed([TASKS[0]])[0], old_payload("team", TASKS[0]))])
    store = open_store(load_settings(data_dir=data_dir).storage, 384)
    marker = np.eye(1, 384, dtype=np.float32)[0]
    store.upsert("recalls", [Point(SCHEMA_POINT, marker, {"schema_version": SCHEMA_VERSION + 1})])
    store.close()

    done = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "--data-dir", str(data_dir)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"schema version {SCHEMA_VERSION + 1}, written by a newer memrl-mcp" in done.stderr
    assert "Upgrade memrl-mcp" in done.stderr
    assert old_fields_left(data_dir) == (1, SCHEMA_VERSION + 1)  # not migrated, not downgraded


@pytest.mark.anyio
async def test_the_schema_point_is_no_recall(client: Client) -> None:
    message = await refused(client, "report_outcome", recall_id=SCHEMA_POINT, reward=1.0)
    assert "unknown recall" in message


@pytest.mark.slow  # a child process
@pytest.mark.parametrize(
    ("marker", "shown"),
    [
        ({"schema_version": "abc"}, 'schema_version "abc", which is not a number'),
        ({"schema_version": None}, "schema_version null, which is not a number"),
        ({"schema_version": "2"}, 'schema_version "2", which is not a number'),
        ({"schema_version": 2.9}, "schema_version 2.9, a fraction"),
        ({"schema_version": True}, "schema_version true, which is not a number"),
        ({"schema_version": -1}, "schema_version -1, a negative number (versions count up from 0)"),
        ({"schema_version": 1e30}, "schema_version 1e+30, a decimal number where a version is written as an integer"),
        ({}, "no schema_version"),
    ],
)
def test_a_damaged_schema_marker_is_refused_clearly_and_never_misread(
    embedder: Embedder, tmp_path: Path, marker: dict[str, Any], shown: str
) -> None:
    """ "2" or 2.9 read as version 2 would let this code take a store of unknown shape for its own."""
    data_dir = tmp_path / "data"
    make_service(embedder, data_dir).close()
    store = open_store(load_settings(data_dir=data_dir).storage, 384)
    store.upsert("recalls", [Point(SCHEMA_POINT, np.eye(1, 384, dtype=np.float32)[0], marker)])
    store.close()

    for command in ([], ["export"]):
        done = subprocess.run(
            [sys.executable, "-m", "memrl_mcp.cli", *command, "--data-dir", str(data_dir)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (command, done.returncode, done.stderr)
        assert f"schema marker (point {SCHEMA_POINT} of the recalls table) holds {shown}" in done.stderr
        assert "not a whole number" not in done.stderr  # -1 and 1e30 are whole numbers: the message says what is wrong
        assert "Traceback" not in done.stderr
    store = open_store(load_settings(data_dir=data_dir).storage, 384)
    try:
        assert store.get("recalls", [SCHEMA_POINT])[SCHEMA_POINT] == marker  # refused untouched
    finally:
        store.close()


def test_records_of_version_3_go_on_and_an_operation_they_applied_is_not_applied_again(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """Version 4 writes a record's applied operations as text and a Q history one event per line; a store of version
    3 holds lists and one-line histories. A report killed after its first memory's update (the operation in that
    memory's list) is finished at the next open without updating that memory twice, and both memories then hold the
    new forms, their histories read whole."""
    data_dir = tmp_path / "data"
    service = make_service(embedder, data_dir, engine, k1=2, k2=2)
    first, second = (
        service.store_experience(NewExperience(task, f"how to {task}", "team"), access=EVERYTHING) for task in TASKS[:2]
    )
    recall = service.recall(RecallQuery(TASKS[0], "team", delta=-1.0), access=EVERYTHING)
    service.close()
    assert {m.id for m in recall.memories} == {first.id, second.id}

    # What version 3 leaves when killed mid-report: the claim written, the first memory updated, not the second.
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
    operation = f"q:{recall.recall_id}"
    reset = {"at": 1.7e9, "event": "reset", "reward": None, "q_before": 0.5, "q_after": 0.0, "recall_id": None}
    reward = {"at": 1.8e9, "event": "reward", "reward": 1.0, "q_before": 0.0, "q_after": 0.3, "recall_id": None}
    updated = {"q": 0.3, "visits": 1, "version": 7, "applied": ["edit:x", operation]}
    store.set_payload("memories", first.id, {**updated, "history": json.dumps([reset, reward])})
    store.set_payload("memories", second.id, {"version": 3, "applied": ["edit:y"], "history": json.dumps([reset])})
    report = {"claim": "c", "reward": 1.0, "reported_at": 1.7e9, "experience": None, "outcome": None, "metadata": {}}
    store.set_payload("recalls", recall.recall_id, {"status": "applying", "report": report})
    store.upsert("recalls", [Point(SCHEMA_POINT, np.eye(1, 384, dtype=np.float32)[0], {"schema_version": 3})])
    store.close()

    service = make_service(embedder, data_dir, engine)  # finishes the report
    try:
        assert service.get(first.id, access=EVERYTHING).visits == 1  # not updated twice
        detail = service.get(second.id, access=EVERYTHING)
        assert (detail.visits, detail.q) == pytest.approx((1, 0.3))
        assert [event.event for event in detail.history] == ["reset", "reward"]
        with pytest.raises(MemoryRequestError, match="already reported"):
            service.report(OutcomeReport(recall.recall_id, 1.0), access=EVERYTHING)
        again = service.recall(RecallQuery(TASKS[0], "team", delta=-1.0), access=EVERYTHING)
        service.report(OutcomeReport(again.recall_id, -1.0), access=EVERYTHING)
        for memory_id, events in ((first.id, 3), (second.id, 3)):
            assert len(service.get(memory_id, access=EVERYTHING).history) == events
    finally:
        service.close()
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
    try:
        assert schema_version(store) == SCHEMA_VERSION
        stored = store.get("memories", [first.id, second.id])
    finally:
        store.close()
    new = operation_token(f"q:{again.recall_id}")  # version 5 keeps tokens; an id kept before still counts
    assert stored[first.id]["applied"] == f"edit:x {operation} {new}"
    assert stored[second.id]["applied"] == f"edit:y {operation_token(operation)} {new}"
    for payload in stored.values():
        assert payload["history"].count("\n") == 2  # one event per line
        assert [event["event"] for event in json.loads(payload["history"])] == ["reset", "reward", "reward"]
