"""A report interrupted by a crash at any of its writes is finished, exactly once, when the store reopens."""

from pathlib import Path

import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.history import HISTORY_TAIL
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery, StatsQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import open_store
from tests.support.crashes import DiesAtWrite

# A report with two recalled memories and a new experience writes 5 times: the claim, one conditional write
# per memory, the new memory, then "reported". Crash before each of them.
REPORT_WRITES = 5


@pytest.mark.parametrize("crash_at", range(REPORT_WRITES))
def test_an_interrupted_report_is_finished_once_on_reopen(
    embedder: Embedder, tmp_path: Path, engine: str, crash_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine, k1=2, k2=2, model_reward_weight=1.0)
    store = open_store(settings.storage, embedder.dim)
    service = MemoryService.open(settings, embedder, store)
    mug = service.store_experience(
        NewExperience("put a clean mug in the coffee machine", "rinse, then place"), access=EVERYTHING
    )
    cup = service.store_experience(
        NewExperience("put a clean cup in the coffee machine", "wash, then place"), access=EVERYTHING
    )
    task = "heat a potato and put it on the table"
    recall = service.recall(RecallQuery(task, delta=-1.0), access=EVERYTHING)
    assert {m.id for m in recall.memories} == {mug.id, cup.id}

    dying = MemoryService(settings, embedder, DiesAtWrite(store, crash_at))
    with pytest.raises(KeyboardInterrupt):
        dying.report(OutcomeReport(recall.recall_id, 1.0, experience="microwave it, then place it"), access=EVERYTHING)
    store.close()

    reopened = MemoryService.open(settings, embedder)  # finishes the interrupted report
    try:
        if crash_at == 0:  # died before claiming: the recall is still pending and can be reported
            reopened.report(
                OutcomeReport(recall.recall_id, 1.0, experience="microwave it, then place it"), access=EVERYTHING
            )
        for memory_id in (mug.id, cup.id):
            memory = reopened.get(memory_id, access=EVERYTHING)
            assert (memory.q, memory.visits, memory.last_reward) == pytest.approx((0.3, 1, 1.0))
        with pytest.raises(MemoryRequestError, match="already reported"):
            reopened.report(OutcomeReport(recall.recall_id, 1.0), access=EVERYTHING)
        learned = [m for m in reopened.memories() if m.task == task]
        assert [m.experience for m in learned] == ["microwave it, then place it"]  # stored once
        assert reopened.stats(StatsQuery(), access=EVERYTHING).recalls_reported == 1
    finally:
        reopened.close()


def test_on_a_qdrant_server_a_replica_finishes_only_reports_left_for_a_minute(
    embedder: Embedder, tmp_path: Path
) -> None:
    """Another replica may be mid-report: a fresh "applying" is left to it; a stale one is finished."""
    settings = load_settings(data_dir=tmp_path, embedded_engine="qdrant-local")
    store = open_store(settings.storage, embedder.dim)
    crashed = MemoryService.open(settings, embedder, store)
    stored = crashed.store_experience(
        NewExperience("defrost the fish in the fridge", "move it from the freezer"), access=EVERYTHING
    )
    recall = crashed.recall(RecallQuery("defrost the fish in the fridge"), access=EVERYTHING)
    dying = MemoryService(settings, embedder, DiesAtWrite(store, 1))  # dies after claiming
    with pytest.raises(KeyboardInterrupt):
        dying.report(OutcomeReport(recall.recall_id, 1.0), access=EVERYTHING)

    # The replicas share the store; the setting only tells them it is a server's.
    shared = settings.model_copy(
        update={"storage": settings.storage.model_copy(update={"qdrant_url": "http://qdrant.internal:6333"})}
    )
    now = crashed.clock()
    MemoryService.open(shared, embedder, store, clock=lambda: now + 5)
    assert store.get("memories", [stored.id])[stored.id]["visits"] == 0  # maybe still in progress elsewhere
    MemoryService.open(shared, embedder, store, clock=lambda: now + 61)
    assert store.get("memories", [stored.id])[stored.id]["visits"] == 1
    assert store.get("recalls", [recall.recall_id])[recall.recall_id]["status"] == "reported"
    store.close()


# A report of one memory whose tail is full writes 4 times: the claim, the copy of the tail to the history table, the
# memory's conditional write (Q and its event), then "reported". Crash before each of them.
TAIL_REPORT_WRITES = 4


@pytest.mark.parametrize("crash_at", range(TAIL_REPORT_WRITES))
def test_a_crash_around_the_copy_of_a_full_tail_shows_no_event_without_its_q(
    embedder: Embedder, tmp_path: Path, engine: str, crash_at: int
) -> None:
    """Killed between the copy of the tail and the Q's write (or anywhere else in the report), the memory shows
    exactly its applied changes before the redo (no event of the unapplied one), and after it the change once."""
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine, k1=1, k2=1)
    store = open_store(settings.storage, embedder.dim)
    service = MemoryService.open(settings, embedder, store)
    task = "put a clean mug in the coffee machine"
    mug = service.store_experience(NewExperience(task, "rinse, then place"), access=EVERYTHING)
    for _ in range(HISTORY_TAIL):
        done = service.recall(RecallQuery(task), access=EVERYTHING)
        service.report(OutcomeReport(done.recall_id, 1.0), access=EVERYTHING)
    before = service.get(mug.id, access=EVERYTHING)
    recall = service.recall(RecallQuery(task), access=EVERYTHING)

    dying = MemoryService(settings, embedder, DiesAtWrite(store, crash_at))
    with pytest.raises(KeyboardInterrupt):
        dying.report(OutcomeReport(recall.recall_id, -1.0), access=EVERYTHING)
    shown = service.get(mug.id, access=EVERYTHING)  # before the redo: the tail may be copied, never shown twice
    assert shown.history == before.history + shown.history[len(before.history) :]
    assert len(shown.history) == len(before.history) + shown.visits - before.visits  # an event only with its Q
    assert shown.history[-1].q_after == shown.q
    store.close()

    reopened = MemoryService.open(settings, embedder)  # finishes the interrupted report
    try:
        if crash_at == 0:  # died before claiming: the recall is still pending and can be reported
            reopened.report(OutcomeReport(recall.recall_id, -1.0), access=EVERYTHING)
        after = reopened.get(mug.id, access=EVERYTHING)
        assert after.history[:-1] == before.history and len(after.history) == HISTORY_TAIL + 1
        event = after.history[-1]
        assert (event.recall_id, event.reward, event.q_before, event.q_after) == (
            recall.recall_id,
            -1.0,
            before.q,
            after.q,
        )
        assert after.visits == before.visits + 1
    finally:
        reopened.close()
