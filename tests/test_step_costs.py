"""What a trajectory report costs (issue 22, item 2), through the real service and store: disk in proportion to the
trajectory, a bounded number of episode records per namespace, and a record capacity that reads a few records per
new step instead of every record of the namespace."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder, embed_scoped, embed_tasks
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.memory.steps import embedded_text
from memrl_mcp.requests import TrajectoryReport
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Store, open_store
from memrl_mcp.surface.server import create_server
from memrl_mcp.validation import TrajectoryStep
from tests.support.crashes import CountingStore
from tests.support.mcp import call
from tests.support.steps import steps_of, synthetic_trajectory

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # measures the disk and the reads of long runs


def disk_bytes(folder: Path) -> int:
    """What the folder takes on disk (du): allocated blocks, not apparent sizes (the engine's files are sparse)."""
    du = subprocess.run(["du", "-sB1", str(folder)], capture_output=True, text=True, check=True)
    return int(du.stdout.split()[0])


# -- disk -------------------------------------------------------------------------------------------


async def report_and_measure(data: Path, embedder: Embedder, arguments: dict[str, Any]) -> tuple[int, int]:
    """(the request's JSON size, the store's growth on disk): through the MCP client, measured closed (flushed)."""
    before = disk_bytes(data)
    service = MemoryService.open(load_settings(data_dir=data, tool_profile="steps"), embedder)
    try:
        async with Client(create_server(service)) as client:
            result = await call(client, "report_trajectory", **arguments)
            assert result["created"] == len(arguments["steps"])
    finally:
        service.close()
    return len(json.dumps(arguments)), disk_bytes(data) - before


@pytest.mark.parametrize(
    ("observation_chars", "action_chars"),
    [(300, 900), (8000, 1000)],  # the trajectory (65x before), the largest request accepted (84x before)
)
async def test_a_trajectory_costs_disk_in_proportion_to_its_size(
    embedder: Embedder, tmp_path: Path, observation_chars: int, action_chars: int
) -> None:
    """200 steps, each its own new record, into a store in use (a one-step report made its tables' first pages,
    ~0.2 MB). Measured after the report and a close: the space of payloads the engine replaced is freed at a flush
    but kept by its files, so a store that rewrote a trajectory after every step stayed as large ever after."""
    data = tmp_path / "data"
    MemoryService.open(load_settings(data_dir=data), embedder).close()
    warm_up = {"task": "warm up", "steps": synthetic_trajectory(0, 1, 300, 900), "episode_id": "0"}
    await report_and_measure(data, embedder, warm_up)
    steps = synthetic_trajectory(1, 200, observation_chars, action_chars)
    arguments = {"task": "tidy the data", "steps": steps, "episode_id": "e-1"}
    size, growth = await report_and_measure(data, embedder, arguments)
    print(f"{size} bytes of JSON: the store grew by {growth} bytes ({growth / size:.1f}x)")
    assert growth <= 10 * size


def segments_bytes(edge: Path, table: str) -> int:
    """A table's points on disk, synced: the segments of its generation in use (a compaction swaps in a new one,
    named by ``<table>.current``) without the write-ahead log (whose 32 MB segment files are dropped once a flush
    has acknowledged them)."""
    os.sync()  # the engine writes through memory-mapped pages: their blocks are allocated when written back
    pointer = edge / f"{table}.current"
    generation = pointer.read_text().strip() if pointer.exists() else table
    return disk_bytes(edge / generation / "segments")


def test_a_long_running_server_reuses_the_space_of_what_it_rewrites(embedder: Embedder, tmp_path: Path) -> None:
    """The same step reported by 4,000 episodes in one process: each report rewrites the step's record and writes,
    then deletes, an episode's progress point; beyond max_reported_episodes (100) episode records go. The engine frees
    a replaced payload only at a flush, and ran none before close: the steps table grew by 6.9 MB per 2,000 reports
    (measured), for as long as the server ran. Flushed every FLUSH_EVERY writes, the space is reused."""
    data = tmp_path / "data"
    service = MemoryService.open(load_settings(data_dir=data, max_reported_episodes=100), embedder)
    edge = data / "memrl" / "edge"
    step = synthetic_trajectory(0, 1, 300, 900)
    sizes = []
    try:
        for i in range(4000):
            service.report_trajectory(TrajectoryReport("tidy the data", steps_of(step), f"e-{i}"), access=EVERYTHING)
            if i + 1 in (2000, 4000):
                sizes.append((segments_bytes(edge, "steps"), segments_bytes(edge, "episodes")))
    finally:
        service.close()
    (steps_then, episodes_then), (steps_now, episodes_now) = sizes
    print(f"2,000 more reports: steps +{steps_now - steps_then} bytes, episodes +{episodes_now - episodes_then}")
    assert steps_now - steps_then <= 256 * 1024
    assert episodes_now - episodes_then <= 1024 * 1024  # deleted points stay in a segment until it is optimized


# -- the bound on episode records ---------------------------------------------------------------------


async def test_a_namespace_keeps_a_bounded_number_of_reported_episodes(embedder: Embedder, tmp_path: Path) -> None:
    """A client reporting under ever new episode ids cannot grow the store without limit: beyond
    max_reported_episodes (5 here) the oldest are forgotten, down to 90% (4). A retry of a kept id is told it was
    applied; a report of a forgotten id is applied as a new episode (documented)."""
    service = MemoryService.open(
        load_settings(data_dir=tmp_path / "data", max_reported_episodes=5, tool_profile="full"), embedder
    )
    steps = synthetic_trajectory(0, 1, 100, 50)
    try:
        async with Client(create_server(service)) as client:
            await call(client, "report_trajectory", task="t", steps=steps, episode_id="other", namespace="lab")
            for i in range(12):
                await call(client, "report_trajectory", task="t", steps=steps, episode_id=f"e-{i}")
                assert (await call(client, "memory_stats", namespace="default"))["episodes_reported"] <= 5
            for kept in ("e-11", "e-10"):
                again = await call(client, "report_trajectory", task="t", steps=steps, episode_id=kept)
                assert again["already_applied"] is True
            forgotten = await call(client, "report_trajectory", task="t", steps=steps, episode_id="e-0")
            assert forgotten["already_applied"] is False and forgotten["merged"] == 1
            visits = [a.visits for r in service.step_records() if r.namespace == "default" for a in r.actions]
            assert visits == [13]  # 12 episodes, and e-0 a second time
            # Another namespace's episodes are its own: untouched.
            lab = await call(client, "memory_stats", namespace="lab")
            assert lab["episodes_reported"] == 1
            again = await call(client, "report_trajectory", task="t", steps=steps, episode_id="other", namespace="lab")
            assert again["already_applied"] is True
    finally:
        service.close()


# -- the record capacity ------------------------------------------------------------------------------


def expected_eviction(store: Store, namespace: str, new: np.ndarray, weight: float) -> str | None:
    """The paper's rule computed the old way, over every pair of the namespace's stored records: the id that goes
    (None: the new record is dropped)."""
    rows = list(store.vectors("steps", {"namespace": namespace}, ("actions",)))
    ids = [row[0] for row in rows]
    vectors = np.stack([row[1] for row in rows]).astype(np.float64)
    dim = vectors.shape[1] // 2

    def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (1 - weight) * a[..., :dim] @ b[..., :dim].T + weight * a[..., dim:] @ b[..., dim:].T

    pairs = similarity(vectors, vectors)
    np.fill_diagonal(pairs, -np.inf)
    i, j = np.unravel_index(int(np.argmax(pairs)), pairs.shape)
    if similarity(new.astype(np.float64), vectors).max() >= pairs[i, j]:
        return None
    samples = {row[0]: sum(a["visits"] for a in row[2]["actions"]) for row in rows}
    first, second = sorted((ids[i], ids[j]))
    return first if samples[first] >= samples[second] else second


def stored_vector(embedder: Embedder, namespace: str, task: str, text: str) -> np.ndarray:
    """The vector a new record of (task, observation) gets: its task's and observation's embeddings side by side."""
    task_vector = embed_tasks(embedder, [task], namespace)[0]
    observation_vector = embed_scoped(embedder, [embedded_text(text, 512)], namespace)[0]
    return np.concatenate([task_vector, observation_vector])


def add_one(
    service: MemoryService, counting: CountingStore, embedder: Embedder, text: str, weight: float
) -> tuple[str | None, int]:
    """Report one new step into the full namespace; check that the record that went is the one the all-pairs rule
    picks. (That rule's choice, the step records read)."""
    task = "tidy the data"
    before = {r.id for r in service.step_records()}
    expected = expected_eviction(counting, "default", stored_vector(embedder, "default", task, text), weight)
    counting.reset()
    steps = [TrajectoryStep(observation=text, action="look", reward=0.0)]
    result = service.report_trajectory(
        TrajectoryReport(task, steps, f"new-{len(before)}-{text[:20]}"), access=EVERYTHING
    )
    read = counting.records_read["steps"]
    after = {r.id for r in service.step_records()}
    if expected is None:
        assert (result.created, result.dropped) == (0, 1) and after == before
    else:
        assert (result.created, result.dropped) == (1, 0) and before - after == {expected}
    return expected, read


async def test_at_capacity_a_new_step_reads_a_few_records_and_evicts_as_the_paper_does(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """A namespace at step_max_records (80): each new record is decided by reading a handful of records, never
    all 80 (the all-pairs rule read every record and built an 80x80 matrix per new record), and the record that
    goes is the one the all-pairs rule picks. A near copy of a stored record is dropped. After a change of
    step_observation_weight, the first new record looks every record's neighbour up again once."""
    capacity = 80
    settings = load_settings(data_dir=tmp_path / "data", embedded_engine=engine, step_max_records=capacity)
    counting = CountingStore(open_store(settings.storage, embedder.dim))
    service = MemoryService.open(settings, embedder, counting)
    fill = synthetic_trajectory(1, capacity, 200, 40)
    newcomers = [step["observation"] for step in synthetic_trajectory(2, 9, 200, 40)]
    try:
        assert (
            service.report_trajectory(
                TrajectoryReport("tidy the data", steps_of(fill), "fill"), access=EVERYTHING
            ).created
            == capacity
        )
        for text in newcomers[:6]:
            evicted, read = add_one(service, counting, embedder, text, 0.6)
            assert evicted is not None and read <= 12, f"{read} step records read at a capacity of {capacity}"
        near_copy = fill[5]["observation"].replace(",", ";")
        evicted, read = add_one(service, counting, embedder, near_copy, 0.6)
        assert evicted is None and read <= 12
    finally:
        service.close()

    settings = settings.model_copy(update={"steps": settings.steps.model_copy(update={"step_observation_weight": 0.3})})
    counting = CountingStore(open_store(settings.storage, embedder.dim))
    service = MemoryService.open(settings, embedder, counting)
    try:
        evicted, read = add_one(service, counting, embedder, newcomers[6], 0.3)
        assert read >= capacity  # every neighbour looked up again under the new weight, once
        for text in newcomers[7:]:
            evicted, read = add_one(service, counting, embedder, text, 0.3)
            assert read <= 12
    finally:
        service.close()
