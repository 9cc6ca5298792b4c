"""The episode memory: MemRL's recall (Phase A by similarity, Phase B by similarity and learned utility), the recall
records that make a report update exactly the memories it was given, and stored experiences with their merge rule.

Inputs are checked and namespaces resolved by the :class:`~memrl_mcp.memory.service.MemoryService` that owns it:
everything here already belongs to its caller.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memrl_mcp.embeddings import Embedder, embed_tasks
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import algorithm
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.admission import Quotas
from memrl_mcp.memory.bounds import OldestBeyond
from memrl_mcp.memory.ledger import WRITE_ATTEMPTS, Ledger, WriteContentionError, variant_id
from memrl_mcp.memory.records import READ, RecallRecord, memory_payload, memory_view
from memrl_mcp.models import (
    ExperienceSource,
    MemoryView,
    PoolCandidate,
    RecalledMemory,
    RecallPool,
    RecallResult,
    SearchResult,
    StoreResult,
)
from memrl_mcp.requests import RecallQuery
from memrl_mcp.settings import Settings
from memrl_mcp.storage import Hit, Point, Store, new_id
from memrl_mcp.storage.disk import DiskFullError
from memrl_mcp.storage.migrations import SCHEMA_POINT
from memrl_mcp.storage.quota import record_bytes
from memrl_mcp.validation import MAX_CHECKS, Check, Outcome, is_point_id


@dataclass(frozen=True)
class Scale:
    """The similarity constants in use: the settings' where they are set, else the embedder's measured ones."""

    delta: float
    merge_threshold: float
    step_delta: float
    z_similarity: algorithm.SimilarityScale

    @classmethod
    def of(cls, settings: Settings, embedder: Embedder) -> Scale:
        profile, given = embedder.similarity, settings.similarity
        delta = profile.delta if given.delta is None else given.delta
        return cls(
            delta=delta,
            merge_threshold=profile.merge if given.merge_threshold is None else given.merge_threshold,
            step_delta=delta if settings.steps.step_delta is None else settings.steps.step_delta,
            z_similarity=algorithm.SimilarityScale(
                mode=settings.retrieval.sim_normalization,
                mean=profile.mean if given.sim_mean is None else given.sim_mean,
                std=profile.std if given.sim_std is None else given.sim_std,
            ),
        )


DAY_SECONDS = 86400.0
RECALLED_AT_STEP_SECONDS = 3600.0


def last_used(payload: Mapping[str, Any]) -> float:
    """When a stored memory was last used: stored, recalled (``recalled_at``, kept to the hour), rewarded, merged or
    edited (``updated_at``), whichever came last."""
    times = [READ[name](payload.get(name)) for name in ("created_at", "updated_at", "recalled_at")]
    return float(max(time for time in times if time is not None))


@dataclass(frozen=True)
class Found:
    """Phase A and B of one resolved query: the query embedding, the pool (Phase A's order) and Phase B's choice."""

    query: RecallQuery
    vector: np.ndarray
    hits: list[Hit]
    selection: algorithm.Selection
    now: float

    @property
    def namespace(self) -> str:
        assert self.query.namespace is not None, "a resolved query names its namespace"
        return self.query.namespace

    def result(self) -> SearchResult:
        hits, scores = self.hits, self.selection.scores
        views = {i: memory_view(hits[i].id, hits[i].payload) for i in self.selection.chosen}
        memories = [
            RecalledMemory(
                **view.model_dump(),
                similarity=hits[i].similarity,
                score=float(scores.total[i]),
                age_days=max(0.0, self.now - view.created_at) / DAY_SECONDS,
            )
            for i, view in views.items()
        ]
        return SearchResult(
            namespace=self.namespace, candidates=len(hits), explored=self.selection.explored, memories=memories
        )

    def pool(self) -> RecallPool:
        chosen, scores = set(self.selection.chosen), self.selection.scores
        candidates = [
            PoolCandidate(
                **memory_view(hit.id, hit.payload).model_dump(),
                similarity=hit.similarity,
                z_similarity=float(scores.z_similarity[i]),
                z_q=float(scores.z_q[i]),
                fade=float(scores.fade[i]),
                score=float(scores.total[i]),
                chosen=i in chosen,
            )
            for i, hit in enumerate(self.hits)
        ]
        return RecallPool(query=self.query, namespace=self.namespace, candidates=candidates)


@dataclass(frozen=True)
class PendingRecall:
    """A recall that can be reported now, and the memories it gave (those not forgotten since)."""

    id: str
    record: RecallRecord
    memories: list[MemoryView]


class EpisodeMemory:
    """Recall, report and store over the ``memories`` and ``recalls`` tables (module docstring)."""

    def __init__(
        self,
        store: Store,
        ledger: Ledger,
        embedder: Embedder,
        settings: Settings,
        clock: Callable[[], float],
        quotas: Quotas,
        scale: Scale,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._embedder = embedder
        self._retrieval = settings.retrieval
        self._learning = settings.learning
        self.scale = scale
        self._clock = clock
        self._quotas = quotas
        self._rng = random.Random(settings.retrieval.seed)
        # One store_experience at a time per process, so that two stores of one task make one memory.
        self._store_lock = threading.Lock()
        self._pending = OldestBeyond(
            store, "recalls", {"status": "pending"}, "created_at", settings.learning.max_pending_recalls
        )

    def find(self, query: RecallQuery, explore: bool, also: Sequence[str] = ()) -> Found:
        """Phase A (the store's search: similarity >= delta, top-k1) then Phase B (:func:`algorithm.select`) for a
        resolved query, in its namespace and those of ``also`` (one pool); ``explore``: with probability epsilon, k2
        candidates drawn uniformly instead."""
        assert query.namespace is not None and query.k1 is not None and query.k2 is not None
        assert query.q_weight is not None and query.delta is not None
        vector = embed_tasks(self._embedder, [query.task], query.namespace)[0]
        searched = [query.namespace, *also] if also else query.namespace
        hits = self._store.search(vector, query.k1, query.delta, {"namespace": searched})
        now = self._clock()
        pool = [
            algorithm.Candidate(h.similarity, READ["q"](h.payload.get("q")), (now - last_used(h.payload)) / DAY_SECONDS)
            for h in hits
        ]
        epsilon = self._retrieval.epsilon if explore else 0.0
        fading = self._retrieval.fade_after_days
        selection = algorithm.select(
            pool, query.k2, query.q_weight, self.scale.z_similarity, epsilon, self._rng, fading
        )
        return Found(query, vector, hits, selection, now)

    def recall(self, query: RecallQuery, also: Sequence[str] = ()) -> RecallResult:
        """:meth:`find`, then log the recall (in the query's namespace) so that its report updates exactly the
        memories it returned, whichever of the namespaces searched each is in."""
        found = self.find(query, explore=True, also=also)
        result = found.result()
        now = self._clock()
        record = RecallRecord(
            namespace=found.namespace,
            task=query.task,
            memory_ids=[m.id for m in result.memories],
            status="pending",
            created_at=now,
            expires_at=now + self._learning.recall_ttl_seconds,
        )
        recall_id = new_id()
        payload = record.payload()
        with self._quotas.admit(found.namespace, record_bytes(payload, found.vector.size)):
            self._store.upsert("recalls", [Point(recall_id, found.vector, payload)])
        self._pending.added(found.namespace)
        for i in found.selection.chosen:  # what fade_after_days reads; to the hour, so most recalls write nothing
            hit = found.hits[i]
            if now - (READ["recalled_at"](hit.payload.get("recalled_at")) or 0.0) >= RECALLED_AT_STEP_SECONDS:
                # not versioned (a report's write keeps it), and nothing is written to a memory forgotten meanwhile
                where = {"namespace": hit.payload.get("namespace")}
                with contextlib.suppress(DiskFullError):  # a hint for the ranking: a full disk keeps recalls working
                    self._store.set_payload_if("memories", hit.id, {"recalled_at": now}, where)
        return RecallResult(recall_id=recall_id, **result.model_dump())

    def pending(self, recall_id: str, access: Access) -> PendingRecall:
        """The caller's recall ``recall_id`` if it can be reported now (:meth:`reportable`), and its memories."""
        record = self.reportable(recall_id, access)
        found = self._store.get("memories", record.memory_ids)
        memories = [memory_view(memory_id, found[memory_id]) for memory_id in record.memory_ids if memory_id in found]
        return PendingRecall(recall_id, record, memories)

    def record(self, recall_id: str, access: Access) -> RecallRecord:
        """The caller's recall ``recall_id`` as stored, whatever its status, or a refusal (another tenant's recall is
        as unknown as one never issued)."""
        payload = self._store.get("recalls", [recall_id]).get(recall_id) if is_point_id(recall_id) else None
        recall = None if payload is None or recall_id == SCHEMA_POINT else RecallRecord.model_validate(payload)
        if recall is None or not access.allows(recall.namespace):
            learning = self._learning
            raise MemoryRequestError(
                f"recall_id: unknown recall {recall_id!r} (never issued, or no longer reportable: it expired after "
                f"recall_ttl_seconds={learning.recall_ttl_seconds:g}, was among the oldest beyond "
                f"max_pending_recalls={learning.max_pending_recalls} of its namespace, or its namespace was forgotten)"
            )
        return recall

    def add_evidence(self, recall_id: str, access: Access, checks: Sequence[Check], window: float) -> RecallRecord:
        """Append ``checks`` to the caller's recall, keeping its newest :data:`~memrl_mcp.validation.MAX_CHECKS`: a
        pending one, or one reported within ``window`` seconds; the record as written. Each write is conditional on
        the revision it read, so concurrent callers each add theirs."""
        for _ in range(WRITE_ATTEMPTS):
            record = self.record(recall_id, access)
            now = self._clock()
            if record.status == "pending" and record.expires_at < now:
                raise MemoryRequestError(f"recall_id: recall {recall_id} expired; its evidence can no longer count")
            if record.status == "applying":
                raise MemoryRequestError(f"recall_id: recall {recall_id} is being reported; send its evidence again")
            if record.status == "reported" and (record.report is None or now - record.report.reported_at > window):
                raise MemoryRequestError(
                    f"recall_id: recall {recall_id} was reported more than correction_window_seconds={window:g} ago; "
                    "its reward is settled"
                )
            evidence = [*record.evidence, *checks][-MAX_CHECKS:]
            update = {"evidence": [check.model_dump() for check in evidence], "revision": record.revision + 1}
            payload = self._store.get("recalls", [recall_id]).get(recall_id) or {}
            seen = payload.get("revision")  # None: a recall stored before its evidence was kept
            if self._store.set_payload_if("recalls", recall_id, update, {"status": record.status, "revision": seen}):
                return record.model_copy(update={"evidence": evidence, "revision": record.revision + 1})
        raise WriteContentionError(f"recall {recall_id}: {WRITE_ATTEMPTS} concurrent writers in a row; retry the call")

    def reportable(self, recall_id: str, access: Access) -> RecallRecord:
        """The pending recall ``recall_id`` of the caller, or a refusal that says why it cannot be reported."""
        recall = self.record(recall_id, access)
        learning = self._learning
        if recall.status != "pending":
            shown = f" (reward {recall.report.reward:g})" if recall.report else ""
            raise MemoryRequestError(
                f"recall_id: recall {recall_id} was already reported{shown}; a recall is reported once"
            )
        if recall.expires_at < self._clock():
            raise MemoryRequestError(
                f"recall_id: recall {recall_id} expired (recall_ttl_seconds={learning.recall_ttl_seconds:g})"
            )
        return recall

    def points(self, namespace: str, memories: Sequence[MemoryView]) -> list[Point]:
        """The memories of ``namespace`` as stored, exactly as given, their tasks embedded (an import)."""
        vectors = embed_tasks(self._embedder, [m.task for m in memories], namespace)
        return [Point(m.id, v, memory_payload(m)) for m, v in zip(memories, vectors, strict=True)]

    def store(
        self,
        namespace: str,
        task: str,
        experience: str,
        outcome: Outcome,
        q: float | None,
        metadata: Mapping[str, Any],
        source: ExperienceSource,
        client: str | None = None,
    ) -> StoreResult:
        """Add a memory under the merge rule (:meth:`~memrl_mcp.memory.ledger.Ledger.keep`): among the variants of this
        task and outcome (similarity >= merge_threshold), an identical experience merges into its twin; a different
        one is a memory of its own, replacing the variant of lowest utility beyond ``max_task_variants``."""
        vector = embed_tasks(self._embedder, [task], namespace)[0]
        with self._store_lock:
            now = self._clock()
            memory = MemoryView(
                id=variant_id(namespace, outcome, task, experience),
                namespace=namespace,
                task=task,
                experience=experience,
                outcome=outcome,
                q=self._learning.q_init(outcome) if q is None else q,
                visits=0,
                last_reward=None,
                merges=0,
                created_at=now,
                updated_at=now,
                metadata=dict(metadata),
                experience_source=source,
                client=client,
            )
            return self._ledger.keep(memory, vector, f"merge:{new_id()}")
