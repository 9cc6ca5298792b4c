"""Floats read back as written: the engine's parser moves some floats (the attack: write them), the stores write
the nearest ones it keeps, and every tool result shows the number the next read shows."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, open_store
from memrl_mcp.storage.numbers import kept, kept_float
from memrl_mcp.surface.server import create_server
from tests.support.mcp import call, read_json
from tests.support.stores import ENGINES

MOVED_TIME = 1795468687.2779167  # a time.time() the engine read back as 1795468687.277917 (a failed CI run)
MOVED_SHARE = 0.18878891023282363  # read back as ...365
KEPT_TIME = "2026-11-23T21:18:07.277916Z"  # what a tool and the next read show of MOVED_TIME: the kept float, in ISO
POINT = "00000000-0000-4000-8000-000000000001"


def hard_floats(count: int) -> list[float]:
    """Times, shares, Q values decaying toward 0, integers, tiny and huge numbers, both signs, the extremes."""
    rng = random.Random(7)
    floats = [rng.uniform(1.7e9, 1.8e9) for _ in range(count)] + [rng.random() for _ in range(count)]
    floats += [0.3 * 0.7**k for k in range(count // 4)] + [float(rng.randint(0, 2**60)) for _ in range(count // 4)]
    floats += [rng.random() * 10 ** rng.randint(-320, 300) for _ in range(count)]
    floats += [-x for x in floats[:count]] + [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, MOVED_TIME]
    return floats


def test_the_edge_engine_moves_floats_and_the_kept_ones_come_back_exact(tmp_path: Path) -> None:
    import qdrant_edge as edge

    floats = hard_floats(2000)
    shard = edge.EdgeShard.create(
        str(tmp_path / "raw"), edge.EdgeConfig(vectors=edge.EdgeVectorParams(size=2, distance=edge.Distance.Cosine))
    )
    payloads = [{"raw": x, "kept": kept_float(x)} for x in floats]
    shard.update(edge.UpdateOperation.upsert_points([edge.Point(i, [1.0, 0.0], p) for i, p in enumerate(payloads)]))
    back: dict[int, dict[str, Any]] = {}
    for record in shard.retrieve(list(range(len(floats))), True, False):  # with the payloads
        assert isinstance(record.id, int) and record.payload is not None
        back[record.id] = record.payload
    moved = sum(back[i]["raw"] != p["raw"] for i, p in enumerate(payloads))
    assert moved > len(floats) // 20  # the premise: written as they are, about one float in six comes back changed
    assert [back[i]["kept"] for i in range(len(floats))] == [p["kept"] for p in payloads]
    assert all(math.isclose(p["kept"], p["raw"], rel_tol=1e-14) for p in payloads)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_write_of_the_store_keeps_its_floats(tmp_path: Path, engine: str) -> None:
    store = open_store(load_settings(data_dir=tmp_path, embedded_engine=engine).storage, 4)
    try:
        floats = hard_floats(200)
        payload = {"namespace": "n", "q": MOVED_SHARE, "history": [{"at": x, "q": -x} for x in floats]}
        store.upsert("memories", [Point(POINT, np.ones(4), payload)])
        assert store.get("memories", [POINT]) == {POINT: kept(payload)}
        update = {"q": MOVED_TIME, "metadata": {"deep": [floats[:50]]}}
        store.set_payload_if("memories", POINT, update, {"namespace": "n"})
        store.set_payload("memories", POINT, {"updated_at": MOVED_TIME})
        (read,) = store.get("memories", [POINT]).values()
        assert (read["q"], read["metadata"], read["updated_at"]) == (
            kept_float(MOVED_TIME),
            kept(update["metadata"]),
            kept_float(MOVED_TIME),
        )
    finally:
        store.close()


@pytest.fixture
async def moved_clock_client(embedder: Embedder, tmp_path: Path, engine: str) -> AsyncIterator[Client]:
    """A server whose clock always reads a time the engine would move."""
    settings = load_settings(data_dir=tmp_path / "data", embedded_engine=engine, tool_profile="full")
    service = MemoryService.open(settings, embedder, clock=lambda: MOVED_TIME)
    try:
        async with Client(create_server(service)) as client:
            yield client
    finally:
        service.close()


async def read_memory(client: Client, memory_id: str) -> dict[str, Any]:
    return await read_json(client, f"memrl://memories/{memory_id}")


@pytest.mark.anyio
async def test_what_a_tool_returns_is_what_the_next_read_shows(moved_clock_client: Client) -> None:
    client = moved_clock_client
    task = "put a clean mug in the coffee machine"
    stored = await call(client, "store_experience", task=task, experience="rinse it", metadata={"w": MOVED_SHARE})
    read = await read_memory(client, stored["id"])
    assert {key: read[key] for key in stored["memory"]} == stored["memory"]
    assert (read["created_at"], read["metadata"]) == (KEPT_TIME, {"w": kept_float(MOVED_SHARE)})

    recall = await call(client, "recall_experience", task=task)
    report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=MOVED_SHARE)
    (change,) = report["updated"]
    read = await read_memory(client, stored["id"])
    assert (report["reward"], change["q_after"]) == (read["last_reward"], read["q"])
    assert read["history"][-1]["reward"] == report["reward"] == kept_float(MOVED_SHARE)

    edited = await call(client, "update_memory", memory_id=stored["id"], metadata={"w": -MOVED_SHARE}, reset_q=True)
    assert edited == await read_memory(client, stored["id"])

    steps = [
        {"observation": "on the counter: a mug", "action": "take mug", "reward": MOVED_SHARE},
        {"observation": "holding a mug", "action": "put mug in coffee machine", "reward": 0.0},
    ]  # credited last to first: take mug's target is its reward plus the next record's best Q, 0
    trajectory = await call(client, "report_trajectory", task=task, steps=steps, episode_id="e-1")
    advice = await call(client, "recall_step_advice", task=task, observation="on the counter: a mug")
    (record, *_) = advice["records"]
    (action,) = record["actions"]
    (change,) = [c for c in trajectory["changes"] if c["action"] == "take mug"]
    (encouraged,) = [a for a in advice["encouraged"] if a["action"] == "take mug"]
    assert action["q"] == change["q_after"] == encouraged["q"] == kept_float(MOVED_SHARE)
    assert record["updated_at"] == KEPT_TIME
    assert read["history"][-1]["at"] == KEPT_TIME
