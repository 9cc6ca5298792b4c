"""Opening a store makes it whole: the payload indexes a table lacks are created at every open (issue 11.7).

A process killed during the first open of a fresh store, between creating a table and indexing it, used to leave
that table without its indexes for good (17 of 60 kills). These tests make that state on purpose (a table created
without indexes) and by SIGKILL during real first opens, then open the store and look at it with the engine's own
eyes (``EdgeShard.load(...).info().payload_schema``).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import qdrant_edge as edge

from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, new_id, open_store
from memrl_mcp.storage.store import INDEXES, TABLES, is_dot, vector_size

DIM = 384
KILLS = 6
CHILD = """
import sys
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import open_store
settings = load_settings(data_dir=sys.argv[1])
print("opening", flush=True)
open_store(settings.storage, 384).close()
"""


def edge_folder(data_dir: Path) -> Path:
    return data_dir / "memrl" / "edge"


def indexes_of(data_dir: Path) -> dict[str, set[str]]:
    """The payload indexes of each table, as the engine reports them (the store must be closed)."""
    found: dict[str, set[str]] = {}
    for table in TABLES:
        shard = edge.EdgeShard.load(str(edge_folder(data_dir) / table))
        found[table] = set(shard.info().payload_schema)
        shard.close()
    return found


def unit_vector(seed: int) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def assert_whole_and_working(data_dir: Path) -> None:
    """Every table has every index, and the store takes a write and answers a filtered search."""
    settings = load_settings(data_dir=data_dir)
    store = open_store(settings.storage, DIM)
    point_id = new_id()
    namespace = f"check-{point_id}"  # a namespace of its own: the filter must pick this point only
    payload = {"namespace": namespace, "outcome": "success", "q": 0.0}
    store.upsert("memories", [Point(point_id, unit_vector(1), payload)])
    assert [hit.id for hit in store.search(unit_vector(1), 5, 0.0, {"namespace": namespace})] == [point_id]
    store.close()
    assert indexes_of(data_dir) == {table: set(INDEXES[table]) for table in TABLES}


def test_a_table_left_without_indexes_gets_them_at_the_next_open(tmp_path: Path) -> None:
    # The state a kill between "create the table" and "index it" leaves: tables that exist, one with a point.
    for table in TABLES:
        distance = edge.Distance.Dot if is_dot(table) else edge.Distance.Cosine
        vectors = edge.EdgeVectorParams(size=vector_size(table, DIM), distance=distance)
        shard = edge.EdgeShard.create(str(edge_folder(tmp_path) / table), edge.EdgeConfig(vectors=vectors))
        if table == "memories":
            point = edge.Point(new_id(), unit_vector(0).tolist(), {"namespace": "n", "outcome": "failure", "q": 0.0})
            shard.update(edge.UpdateOperation.upsert_points([point]))
        shard.close()
    assert indexes_of(tmp_path) == {table: set() for table in TABLES}

    assert_whole_and_working(tmp_path)
    memories = edge.EdgeShard.load(str(edge_folder(tmp_path) / "memories"))
    assert memories.info().payload_schema["namespace"].points == 2  # the point written before the index too
    memories.close()
    assert_whole_and_working(tmp_path)  # idempotent: a second open finds nothing to add and no error


@pytest.mark.slow  # a child process
def test_sigkill_during_the_first_open_never_leaves_a_table_unindexed(tmp_path: Path) -> None:
    rng = random.Random(11)
    for kill in range(KILLS):
        data_dir = tmp_path / f"store-{kill}"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(data_dir)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "opening"
        time.sleep(rng.uniform(0.0, 0.4))  # a first open takes 0.2-1.1 s here: kills land before, in and after
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert_whole_and_working(data_dir)


def test_recalls_are_memory_mapped_in_new_and_older_stores(tmp_path: Path) -> None:
    """Pending recalls stay out of resident memory (issue 11.3): their vectors and payload are memory-mapped
    (``Cold``), in a new store and in one made before, whose recalls table is rewritten at the next open."""
    older, new = tmp_path / "older", tmp_path / "new"
    vectors = edge.EdgeVectorParams(size=DIM, distance=edge.Distance.Cosine)
    edge.EdgeShard.create(str(edge_folder(older) / "recalls"), edge.EdgeConfig(vectors=vectors)).close()
    for data_dir in (older, new):
        assert_whole_and_working(data_dir)
        config = json.loads((edge_folder(data_dir) / "recalls" / "edge_config.json").read_text())  # the engine's
        assert (config["payload_memory"], config["vectors"][""]["memory"]) == ("cold", "cold"), data_dir


@pytest.mark.slow  # a child process
def test_the_resident_memory_benchmark_runs(tmp_path: Path) -> None:
    """perf/recall_rss.py at a tiny size (its figures, at 50,000 recalls: docs/performance.md)."""
    script = Path(__file__).resolve().parents[1] / "perf" / "recall_rss.py"
    result = subprocess.run(
        [sys.executable, str(script), "--recalls", "300"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "300 recalls pending" in result.stdout
    assert "same store, reopened" in result.stdout
