"""On a Qdrant cluster, every write waits for strong ordering and every read consults a majority of replicas:
the optimistic writes are trusted only once read back, and a read-back that missed its write could apply a reward
twice or lose it. No Qdrant server runs here, so the calls themselves are checked, on qdrant-client's local mode,
which takes the same arguments."""

from pathlib import Path
from typing import Any, cast

from qdrant_client import QdrantClient, models

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import ForgetRequest, NewExperience, OutcomeReport, RecallQuery, StatsQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import QdrantClientStore

WRITES = {"upsert", "set_payload", "delete", "create_payload_index"}
READS = {"retrieve", "scroll", "query_points"}


class Recording:
    """A qdrant-client whose calls are written down with their keyword arguments."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return attribute(*args, **kwargs)

        return call


def test_every_write_is_strongly_ordered_and_every_read_a_majority_read(embedder: Embedder, tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine="qdrant-local")
    store = QdrantClientStore(embedder.dim, settings.storage.collection, path=tmp_path / "qdrant-local")
    recording = Recording(store._client)
    store._client = cast(QdrantClient, recording)  # a stand-in: every attribute it has is the client's
    service = MemoryService.open(settings, embedder, store)
    try:
        kept = service.store_experience(
            NewExperience("water the plants", "use the blue can", "garden"), access=EVERYTHING
        )
        service.store_experience(
            NewExperience("water the plants", "use the green can", "garden"), access=EVERYTHING
        )  # a merge
        recall = service.recall(RecallQuery("water the plants", "garden"), access=EVERYTHING)
        service.report(OutcomeReport(recall.recall_id, 1.0, "filled the can first"), access=EVERYTHING)
        service.search(RecallQuery("water the plants", "garden"), access=EVERYTHING)
        service.stats(StatsQuery("garden"), access=EVERYTHING)
        service.forget(ForgetRequest(kept.id), access=EVERYTHING)
        service.forget(ForgetRequest(namespace="garden"), access=EVERYTHING)
        service.housekeeping(stale_after=0.0)
    finally:
        service.close()
    used = {name for name, _ in recording.calls}
    assert used >= {"upsert", "set_payload", "delete", "retrieve", "scroll", "query_points"}
    for name, arguments in recording.calls:
        if name in WRITES:
            assert (arguments.get("wait"), arguments.get("ordering")) == (True, models.WriteOrdering.STRONG), name
        if name in READS:
            assert arguments.get("consistency") == models.ReadConsistencyType.MAJORITY, name
