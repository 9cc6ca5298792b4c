"""A report interrupted by a crash at any of its writes is finished, exactly once, when the store reopens."""

from pathlib import Path
from typing import Any

import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory import MemoryRequestError, MemoryService
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Store, open_store

WRITES = ("upsert", "set_payload", "set_payload_if")
# A report with two recalled memories and a new experience writes 5 times: the claim, one conditional write
# per memory, the new memory, then "reported". Crash before each of them.
REPORT_WRITES = 5


class DiesAtWrite:
    """The real store, except that the process 'dies' at its n-th write (0-based) once armed."""

    def __init__(self, store: Store, n: int) -> None:
        self._store = store
        self._left = n

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in WRITES:
            return method

        def write(*args: Any, **kwargs: Any) -> Any:
            if self._left == 0:
                raise KeyboardInterrupt("killed mid-report")
            self._left -= 1
            return method(*args, **kwargs)

        return write


@pytest.mark.parametrize("crash_at", range(REPORT_WRITES))
def test_an_interrupted_report_is_finished_once_on_reopen(
    embedder: Embedder, tmp_path: Path, engine: str, crash_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine, k1=2, k2=2)
    store = open_store(settings, embedder.dim)
    service = MemoryService(settings, embedder, store)
    mug = service.store_experience("put a clean mug in the coffee machine", "rinse, then place")
    cup = service.store_experience("put a clean cup in the coffee machine", "wash, then place")
    task = "heat a potato and put it on the table"
    recall = service.recall(task, delta=-1.0)
    assert {m.id for m in recall.memories} == {mug.id, cup.id}

    service._store = DiesAtWrite(store, crash_at)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        service.report(recall.recall_id, 1.0, experience="microwave it, then place it")
    store.close()

    reopened = MemoryService(settings, embedder, open_store(settings, embedder.dim))
    try:
        if crash_at == 0:  # died before claiming: the recall is still pending and can be reported
            reopened.report(recall.recall_id, 1.0, experience="microwave it, then place it")
        for memory_id in (mug.id, cup.id):
            memory = reopened.get(memory_id)
            assert (memory.q, memory.visits, memory.last_reward) == (pytest.approx(0.3), 1, 1.0)
        with pytest.raises(MemoryRequestError, match="already reported"):
            reopened.report(recall.recall_id, 1.0)
        learned = [m for m in reopened.memories() if m.task == task]
        assert [m.experience for m in learned] == ["microwave it, then place it"]  # stored once
        assert reopened.stats().recalls_reported == 1
    finally:
        reopened.close()
