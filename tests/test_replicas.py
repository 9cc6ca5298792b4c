"""Replicas on one Qdrant: two memory services over one store, with no lock in common.

No Qdrant server runs on these machines, so the replicas share one store object instead of one server:
qdrant-client's local mode (the API a server is reached through) and qdrant-edge. Each of its calls is
atomic, as each update operation of a Qdrant server is; everything else (versions, conditional writes,
claims) is exactly what replicas on a server run.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.ledger import variant_id
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import QChange
from memrl_mcp.requests import ForgetRequest, NewExperience, OutcomeReport, RecallQuery, StatsQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Store, open_store

ALPHA = 0.3
TASKS = ("open the drawer and take the key", "unlock the door with the key", "put the key back in the drawer")


@pytest.fixture
def replicas(embedder: Embedder, tmp_path: Path, engine: str) -> Iterator[tuple[MemoryService, MemoryService]]:
    settings = load_settings(
        data_dir=tmp_path, embedded_engine=engine, k1=3, k2=3, delta=-1.0, alpha=ALPHA, model_reward_weight=1.0
    )
    store: Store = open_store(settings.storage, embedder.dim)
    first, second = MemoryService(settings, embedder, store), MemoryService(settings, embedder, store)
    yield first, second
    store.close()


def run_together(jobs: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run every job in its own thread, released at once; each result or exception, in order."""
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = jobs[i]()
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_concurrent_reports_on_two_replicas_lose_no_update(replicas: tuple[MemoryService, MemoryService]) -> None:
    first, second = replicas
    ids = [first.store_experience(NewExperience(task, "look around first"), access=EVERYTHING).id for task in TASKS]
    rng = random.Random(7)
    work = []
    for i in range(48):
        replica = (first, second)[i % 2]
        recall = replica.recall(RecallQuery(TASKS[i % len(TASKS)]), access=EVERYTHING)
        assert {m.id for m in recall.memories} == set(ids)
        work.append((replica, recall.recall_id, rng.choice((-1.0, 0.5, 1.0))))

    results = run_together([partial(r.report, OutcomeReport(rid, w), access=EVERYTHING) for r, rid, w in work])
    assert not [r for r in results if isinstance(r, Exception)]

    for memory_id in ids:
        # Every acknowledged change, ordered by visits, must chain: no gap, no repeat, no lost write.
        changes: list[QChange] = sorted(
            (c for result in results for c in result.updated if c.id == memory_id), key=lambda c: c.visits
        )
        assert [c.visits for c in changes] == list(range(1, len(work) + 1))
        for previous, change in itertools.pairwise(changes):
            assert change.q_before == pytest.approx(previous.q_after, abs=1e-12)  # qdrant-edge keeps ~1e-16
        for change in changes:
            reward = next(r.reward for r in results if change in r.updated)
            assert change.q_after == pytest.approx(change.q_before + ALPHA * (reward - change.q_before))
        stored = second.get(memory_id, access=EVERYTHING)
        assert (stored.visits, stored.q) == pytest.approx((len(work), changes[-1].q_after), abs=1e-12)


def test_a_recall_reported_on_both_replicas_at_once_counts_once(
    replicas: tuple[MemoryService, MemoryService],
) -> None:
    first, second = replicas
    memory_id = first.store_experience(NewExperience(TASKS[0], "pull the handle"), access=EVERYTHING).id
    recalls = [first.recall(RecallQuery(TASKS[0], k1=1, k2=1), access=EVERYTHING).recall_id for _ in range(16)]

    jobs = [
        partial(r.report, OutcomeReport(rid, 1.0, experience="it worked"), access=EVERYTHING)
        for rid in recalls
        for r in replicas
    ]
    results = run_together(jobs)
    for rid, pair in zip(recalls, zip(results[::2], results[1::2], strict=True), strict=True):
        won = [r for r in pair if not isinstance(r, Exception)]
        lost = [r for r in pair if isinstance(r, Exception)]
        assert len(won) == 1, (rid, pair)
        assert isinstance(lost[0], MemoryRequestError) and "already reported" in str(lost[0])
    memory = second.get(memory_id, access=EVERYTHING)
    assert memory.visits == len(recalls)
    assert memory.q == pytest.approx(1 - (1 - ALPHA) ** len(recalls))
    # The 16 experiences, one text for one task and outcome, fold into one memory of their own beside the twin the
    # recalls saw (a different procedure): no duplicates, whichever replica stored each.
    assert sorted(m.id for m in first.memories()) == sorted(
        [memory_id, variant_id("default", "success", TASKS[0], "it worked")]
    )
    assert memory.merges == 0


def test_a_memory_forgotten_on_one_replica_is_not_revived_by_a_report_on_the_other(
    replicas: tuple[MemoryService, MemoryService],
) -> None:
    first, second = replicas
    keep, drop = (
        first.store_experience(NewExperience(task, "step by step"), access=EVERYTHING).id for task in TASKS[:2]
    )
    recall = first.recall(RecallQuery(TASKS[0], k1=2, k2=2), access=EVERYTHING)
    second.forget(ForgetRequest(memory_id=drop), access=EVERYTHING)
    result = first.report(OutcomeReport(recall.recall_id, 1.0), access=EVERYTHING)
    assert [c.id for c in result.updated] == [keep]
    assert result.missing == [drop]
    with pytest.raises(MemoryRequestError, match="no memory"):
        second.get(drop, access=EVERYTHING)
    assert second.stats(StatsQuery(), access=EVERYTHING).memories == 1
