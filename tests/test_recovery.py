"""A report interrupted between its redo record and the memories is finished when the store reopens."""

from pathlib import Path
from typing import Any

import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory import MemoryRequestError, MemoryService
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Store, open_store


class DiesOnMemoryWrite:
    """The real store, except that the process 'dies' at the first write to a memory's payload."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def set_payload(self, table: str, point_id: str, payload: dict[str, Any]) -> None:
        if table == "memories":
            raise KeyboardInterrupt("killed mid-report")
        self._store.set_payload(table, point_id, payload)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_an_interrupted_report_is_finished_on_reopen(embedder: Embedder, tmp_path: Path, engine: str) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    store = open_store(settings, embedder.dim)
    service = MemoryService(settings, embedder, store)
    stored = service.store_experience("put a clean mug in the coffee machine", "rinse, then place")
    recall = service.recall("put a clean mug in the coffee machine")

    service._store = DiesOnMemoryWrite(store)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        service.report(recall.recall_id, 1.0)
    assert store.get("memories", [stored.id])[stored.id]["visits"] == 0  # the reward is not applied yet
    store.close()

    reopened = MemoryService(settings, embedder, open_store(settings, embedder.dim))
    try:
        memory = reopened.get(stored.id)
        assert (memory.q, memory.visits, memory.last_reward) == (pytest.approx(0.3), 1, 1.0)
        with pytest.raises(MemoryRequestError, match="already reported"):
            reopened.report(recall.recall_id, 1.0)
        assert reopened.get(stored.id).visits == 1  # applied once, not twice
    finally:
        reopened.close()
