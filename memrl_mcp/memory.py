"""The memory service: MemRL's loop (recall -> act -> report) over an embedder and a Qdrant store.

Safe for concurrent callers: threads of one server, and replicas of the server sharing one Qdrant server. The
learned state is written only through :mod:`memrl_mcp.optimistic` (conditional writes, claimed reports that are
their own redo log); every input passes the rules of :mod:`memrl_mcp.validation`; the tables' records are typed
in :mod:`memrl_mcp.records`. Every method that serves a caller takes the caller's :class:`Access`, required.

Unreported recalls are bounded: one expires after ``recall_ttl_seconds``, and a namespace keeps at most
``max_pending_recalls`` pending (the oldest go first), so a client that never reports cannot grow the store
without limit.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Self

import numpy as np

from memrl_mcp import algorithm
from memrl_mcp.access import Access
from memrl_mcp.embeddings import CachedEmbedder, Embedder, create_embedder
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.models import (
    EffectiveSettings,
    ForgetResult,
    MemoryView,
    Outcome,
    RecalledMemory,
    RecallResult,
    ReportResult,
    SearchResult,
    Stats,
    StoreResult,
)
from memrl_mcp.optimistic import Ledger, NewMemory
from memrl_mcp.records import ClaimedReport, RecallRecord, memory_payload, memory_view
from memrl_mcp.settings import Settings
from memrl_mcp.storage import Hit, Point, Store, new_id, open_store
from memrl_mcp.tally import q_summary
from memrl_mcp.validation import COUNT, DELTA, NAMESPACE, POINT_ID, Q_WEIGHT, TIMESTAMP, K, Limits

PURGE_INTERVAL_SECONDS = 3600.0  # how often a running server drops expired recalls and finishes stale reports
STALE_REPORT_SECONDS = 60.0  # a report still "applying" after this long was interrupted: finish it
RESTORE_BATCH = 256  # memories embedded and written together by an import
EVICT_DOWN_TO = 0.9  # of max_pending_recalls: what an eviction leaves, so the next count is a tenth of it away


class MemoryService:
    """recall / report / store / forget / stats over one store, with MemRL's scoring and update.

    The constructor does no I/O; :meth:`open` builds the parts and finishes what a crash interrupted."""

    def __init__(
        self, settings: Settings, embedder: Embedder, store: Store, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self.limits = Limits(
            settings.max_task_chars,
            settings.max_experience_chars,
            settings.max_metadata_chars,
            (settings.reward_min, settings.reward_max),
        )
        self._store = store
        self._ledger = Ledger(store)
        self._clock = clock
        self._rng = random.Random(settings.seed)
        # One store_experience at a time per process, so that two stores of one task make one memory.
        self._store_lock = threading.Lock()
        self._calls = threading.Condition()
        self._active_calls = 0
        self._closed = False
        self._housekept_at = -float("inf")
        self._pending_budget: dict[str, int] = {}  # per namespace, recalls to go before counting its pending ones
        profile = embedder.similarity
        self.delta = profile.delta if settings.delta is None else settings.delta
        self.merge_threshold = profile.merge if settings.merge_threshold is None else settings.merge_threshold
        self.scale = algorithm.SimilarityScale(
            mode=settings.sim_normalization,
            mean=profile.mean if settings.sim_mean is None else settings.sim_mean,
            std=profile.std if settings.sim_std is None else settings.sim_std,
        )
        self._new_memory = NewMemory(settings.q_init_success, settings.q_init_failure, settings.max_metadata_chars)

    @classmethod
    def open(
        cls,
        settings: Settings,
        embedder: Embedder | None = None,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Self:
        """Build the embedder and open the store the settings name (unless given), then recover: an embedded
        store is this process's alone, so whatever is still "applying" was interrupted and is finished now; on a
        Qdrant server another replica may be mid-report, so only reports left for a while are."""
        embedder = embedder or create_embedder(settings)
        service = cls(settings, embedder, store or open_store(settings, embedder.dim), clock)
        try:
            service.housekeeping(stale_after=STALE_REPORT_SECONDS if settings.qdrant_url else 0.0)
        except BaseException:
            service.close()  # release the store (an embedded one is locked while open)
            raise
        return service

    @property
    def write_conflicts(self) -> int:
        """Optimistic writes that lost a race and were retried (a metric)."""
        return self._ledger.conflicts

    def close(self) -> None:
        """Refuse new calls, wait for the ones in flight, then close the store."""
        with self._calls:
            self._closed = True
            self._calls.wait_for(lambda: self._active_calls == 0)
        self._store.close()

    @contextmanager
    def _call(self) -> Iterator[None]:
        with self._calls:
            if self._closed:
                raise MemoryRequestError("the memory is closed (the server is shutting down)")
            self._active_calls += 1
        try:
            yield
        finally:
            with self._calls:
                self._active_calls -= 1
                self._calls.notify_all()

    def housekeeping(self, stale_after: float) -> None:
        """Finish reports interrupted (``applying`` for ``stale_after`` seconds or more), drop expired recalls."""
        now = self._clock()
        for recall_id, payload in list(self._store.scroll("recalls", {"status": "applying"})):
            recall = RecallRecord.model_validate(payload)
            if recall.report is not None and now - recall.report.reported_at >= stale_after:
                self._ledger.redo(recall_id, recall, self.settings.alpha, self._new_memory)
        self._store.purge_recalls(expired_before=now)
        self._housekept_at = now

    def _embed_tasks(self, tasks: Sequence[str], namespace: str) -> np.ndarray:
        """Embed the tasks' canonical forms, so that spacing and a trailing full stop make no twin
        (MiniLM puts "x." and "x" as far as 0.90 apart, while distinct tasks reach 0.98). The cache is
        partitioned by namespace, the unit of tenancy: a caller can only hit vectors computed for a namespace
        its token may use, so the time of a call tells nothing about another tenant's recent tasks."""
        canonical = [" ".join(task.split()).rstrip(".!;, ") or task.strip() for task in tasks]
        if isinstance(self.embedder, CachedEmbedder):
            return self.embedder.embed(canonical, scope=namespace)
        return self.embedder.embed(canonical)

    # -- recall ---------------------------------------------------------------------------------

    def search(
        self,
        task: str,
        namespace: str | None = None,
        k1: int | None = None,
        k2: int | None = None,
        q_weight: float | None = None,
        delta: float | None = None,
        *,
        access: Access,
    ) -> SearchResult:
        """Phase A and B without a recall to report: read-only (a RAG baseline, a look-up)."""
        with self._call():
            result, _, _ = self._search(task, namespace, k1, k2, q_weight, delta, access)
        return result

    def recall(
        self,
        task: str,
        namespace: str | None = None,
        k1: int | None = None,
        k2: int | None = None,
        q_weight: float | None = None,
        delta: float | None = None,
        *,
        access: Access,
    ) -> RecallResult:
        """Phase A (similarity >= delta, top-k1), then Phase B (value-aware top-k2); logs the recall so that its
        report updates exactly these memories."""
        with self._call():
            result, vector, hits = self._search(task, namespace, k1, k2, q_weight, delta, access)
            now = self._clock()
            if now - self._housekept_at > PURGE_INTERVAL_SECONDS:
                self.housekeeping(stale_after=STALE_REPORT_SECONDS)
            record = RecallRecord(
                namespace=result.namespace,
                task=task,
                memory_ids=[m.id for m in result.memories],
                twins={h.payload["outcome"]: h.id for h in reversed(hits) if h.similarity >= self.merge_threshold},
                status="pending",
                created_at=now,
                expires_at=now + self.settings.recall_ttl_seconds,
            )
            recall_id = new_id()
            self._store.upsert("recalls", [Point(recall_id, vector, record.payload())])
            self._bound_pending(result.namespace)
        return RecallResult(recall_id=recall_id, **result.model_dump())

    def _search(
        self,
        task: str,
        namespace: str | None,
        k1: int | None,
        k2: int | None,
        q_weight: float | None,
        delta: float | None,
        access: Access,
    ) -> tuple[SearchResult, np.ndarray, list[Hit]]:
        s = self.settings
        task = self.limits.task.check("task", task)
        namespace = self._namespace(namespace, access)
        k1 = K.check("k1", s.k1 if k1 is None else k1)
        k2 = K.check("k2", s.k2 if k2 is None else k2)
        if k2 > k1:
            raise MemoryRequestError(f"k2: {k2} exceeds k1 ({k1}): Phase B picks among Phase A's candidates")
        q_weight = Q_WEIGHT.check("q_weight", s.q_weight if q_weight is None else q_weight)
        delta = DELTA.check("delta", self.delta if delta is None else delta)
        vector = self._embed_tasks([task], namespace)[0]
        hits = self._store.search(vector, k1, delta, {"namespace": namespace})
        pool = [algorithm.Candidate(h.similarity, float(h.payload["q"])) for h in hits]
        chosen, scores, explored = algorithm.select(pool, k2, q_weight, self.scale, s.epsilon, self._rng)
        memories = [
            RecalledMemory(
                **memory_view(hits[i].id, hits[i].payload).model_dump(),
                similarity=hits[i].similarity,
                score=float(scores[i]),
            )
            for i in chosen
        ]
        result = SearchResult(namespace=namespace, candidates=len(pool), explored=explored, memories=memories)
        return result, vector, hits

    def _bound_pending(self, namespace: str) -> None:
        """Keep at most ``max_pending_recalls`` pending recalls in the namespace: over the bound, drop the oldest
        down to :data:`EVICT_DOWN_TO` of it (reporting one of them is then refused as expired).

        Counting is a scan in qdrant-client's local mode (160 ms at 1000 recalls, against 0.2 ms on qdrant-edge),
        so a process counts a namespace's pending recalls only once its recalls since the last count could have
        reached the bound (reports only lower the count). Replicas on one Qdrant server may each add that many
        between counts."""
        budget = self._pending_budget.get(namespace, 0)
        if budget > 0:
            self._pending_budget[namespace] = budget - 1
            return
        bound = self.settings.max_pending_recalls
        where = {"namespace": namespace, "status": "pending"}
        pending = self._store.count("recalls", where)
        if pending > bound:
            ages = sorted(
                (float(payload["created_at"]), recall_id)
                for recall_id, payload in self._store.scroll("recalls", where, ("created_at",))
            )
            keep = int(bound * EVICT_DOWN_TO)
            self._store.delete("recalls", [recall_id for _, recall_id in ages[: max(len(ages) - keep, 0)]])
            pending = min(pending, keep)
        self._pending_budget[namespace] = bound - pending

    # -- report ---------------------------------------------------------------------------------

    def report(
        self,
        recall_id: str,
        reward: float,
        experience: str | None = None,
        outcome: Outcome | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        access: Access,
    ) -> ReportResult:
        """Q <- Q + alpha (R - Q) on the recalled memories, once; then store the new experience."""
        reward = self.limits.reward.check("reward", reward)
        if experience is not None:
            experience = self.limits.experience.check("experience", experience)
            outcome = outcome or ("success" if reward > 0 else "failure")
        if outcome is not None:
            _check_outcome(outcome)
        meta = self._metadata(metadata)
        with self._call():
            self._recall_to_report(recall_id, access)
            report = ClaimedReport(
                claim=new_id(),
                reward=reward,
                reported_at=self._clock(),
                experience=experience,
                outcome=outcome,
                metadata=meta,
            )
            recall = self._ledger.claim(recall_id, report)
            applied = self._ledger.redo(recall_id, recall, self.settings.alpha, self._new_memory)
        return ReportResult(
            recall_id=recall_id, reward=reward, updated=applied.changes, missing=applied.missing, stored=applied.stored
        )

    def _recall_to_report(self, recall_id: str, access: Access) -> RecallRecord:
        payload = self._store.get("recalls", [recall_id]).get(recall_id) if _is_point_id(recall_id) else None
        recall = None if payload is None else RecallRecord.model_validate(payload)
        if recall is None or not access.allows(recall.namespace):
            s = self.settings
            raise MemoryRequestError(
                f"recall_id: unknown recall {recall_id!r} (never issued, or no longer reportable: it expired after "
                f"recall_ttl_seconds={s.recall_ttl_seconds:g}, was among the oldest beyond max_pending_recalls="
                f"{s.max_pending_recalls} of its namespace, or its namespace was forgotten)"
            )
        if recall.status != "pending":
            shown = f" (reward {recall.report.reward:g})" if recall.report else ""
            raise MemoryRequestError(
                f"recall_id: recall {recall_id} was already reported{shown}; a recall is reported once"
            )
        if recall.expires_at < self._clock():
            raise MemoryRequestError(
                f"recall_id: recall {recall_id} expired (recall_ttl_seconds={self.settings.recall_ttl_seconds:g})"
            )
        return recall

    # -- store ----------------------------------------------------------------------------------

    def store_experience(
        self,
        task: str,
        experience: str,
        namespace: str | None = None,
        outcome: Outcome = "success",
        q: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        access: Access,
    ) -> StoreResult:
        """Add a memory directly (seeding, imports); a near-duplicate task with the same outcome merges."""
        task = self.limits.task.check("task", task)
        experience = self.limits.experience.check("experience", experience)
        namespace = self._namespace(namespace, access)
        _check_outcome(outcome)
        if q is not None:
            q = self.limits.reward.check("q", q)
        meta = self._metadata(metadata)
        with self._call():
            vector = self._embed_tasks([task], namespace)[0]
            with self._store_lock:
                now = self._clock()
                twins = self._store.search(
                    vector, 1, self.merge_threshold, {"namespace": namespace, "outcome": outcome}
                )
                if twins:
                    merged = self._ledger.merge(
                        twins[0].id, f"merge:{new_id()}", experience, meta, now, self.settings.max_metadata_chars
                    )
                    if merged is not None:
                        return merged
                if q is None:
                    q = self.settings.q_init_success if outcome == "success" else self.settings.q_init_failure
                memory = MemoryView(
                    id=new_id(),
                    namespace=namespace,
                    task=task,
                    experience=experience,
                    outcome=outcome,
                    q=q,
                    visits=0,
                    last_reward=None,
                    merges=0,
                    created_at=now,
                    updated_at=now,
                    metadata=meta,
                )
                return self._ledger.add(memory, vector)

    # -- forget, read, stats --------------------------------------------------------------------

    def forget(self, memory_id: str | None = None, namespace: str | None = None, *, access: Access) -> ForgetResult:
        """Delete one memory by id, or every memory and recall of a namespace (exactly one of the two).

        A namespace's recalls go first, then its memories: a crash in between leaves memories (run forget
        again) but no recall whose report could bring the forgotten tasks back."""
        if (memory_id is None) == (namespace is None):
            raise MemoryRequestError("give exactly one of memory_id (one memory) or namespace (all of it)")
        with self._call():
            if memory_id is not None:
                self.get(memory_id, access=access)
                self._store.delete("memories", [memory_id])
                return ForgetResult(deleted=1)
            where = {"namespace": self._namespace(namespace, access)}
            self._store.delete_where("recalls", where)
            deleted = self._store.count("memories", where)
            self._store.delete_where("memories", where)
            return ForgetResult(deleted=deleted)

    def get(self, memory_id: str, *, access: Access) -> MemoryView:
        payload = self._store.get("memories", [memory_id]).get(memory_id) if _is_point_id(memory_id) else None
        if payload is None or not access.allows(payload["namespace"]):
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r}")
        return memory_view(memory_id, payload)

    def stats(self, namespace: str | None = None, *, access: Access) -> Stats:
        """Of one namespace, or of every namespace the caller may use: from the store's counts
        (:mod:`memrl_mcp.tally`), not by reading every memory."""
        where: dict[str, Any] = {}
        if namespace is not None:
            where["namespace"] = self._namespace(namespace, access)
        elif access.namespaces is not None:
            where["namespace"] = sorted(access.namespaces)
        chosen = where.get("namespace")
        counts = self._store.tally(None if chosen is None else [chosen] if isinstance(chosen, str) else chosen)
        return Stats(
            namespace=namespace,
            memories=counts.memories,
            successes=counts.successes,
            failures=counts.failures,
            q=q_summary(counts),
            visits=counts.visits,
            recalls_pending=self._store.count("recalls", {**where, "status": "pending"}),
            recalls_reported=self._store.count("recalls", {**where, "status": "reported"}),
        )

    def effective_settings(self) -> EffectiveSettings:
        """The constants recall and report use, the embedder's defaults applied (no secret, no tenant data)."""
        s = self.settings
        return EffectiveSettings(
            embedder=self.embedder.name,
            k1=s.k1,
            k2=s.k2,
            q_weight=s.q_weight,
            alpha=s.alpha,
            delta=self.delta,
            sim_normalization=self.scale.mode,
            sim_mean=self.scale.mean,
            sim_std=self.scale.std,
            merge_threshold=self.merge_threshold,
            epsilon=s.epsilon,
            q_init_success=s.q_init_success,
            q_init_failure=s.q_init_failure,
            reward_min=s.reward_min,
            reward_max=s.reward_max,
            read_only=s.read_only,
        )

    # -- the operator's: metrics and backups (no caller, every namespace) -------------------------

    def count(self) -> int:
        """Memories stored, in every namespace (a metric)."""
        return self._store.count("memories")

    def memories(self) -> Iterator[MemoryView]:
        """Every memory, in storage order: what an export writes."""
        for memory_id, payload in self._store.scroll("memories"):
            yield memory_view(memory_id, payload)

    def check_memory(self, memory: MemoryView) -> None:
        """Refuse a memory to restore that the tools could not have stored; the message names the field."""
        POINT_ID.check("id", memory.id)
        NAMESPACE.check("namespace", memory.namespace)
        self.limits.task.check("task", memory.task)
        self.limits.experience.check("experience", memory.experience)
        _check_outcome(memory.outcome)
        self.limits.reward.check("q", memory.q)
        if memory.last_reward is not None:
            self.limits.reward.check("last_reward", memory.last_reward)
        COUNT.check("visits", memory.visits)
        COUNT.check("merges", memory.merges)
        TIMESTAMP.check("created_at", memory.created_at)
        TIMESTAMP.check("updated_at", memory.updated_at)
        self._metadata(memory.metadata)

    def restore(self, memories: Sequence[MemoryView]) -> int:
        """Write memories exactly as given (same id, Q, visits, timestamps), re-embedding their tasks.
        A memory whose id is already stored is replaced. Every memory is checked before any is written."""
        for memory in memories:
            self.check_memory(memory)
        return self.restore_stream(memories)

    def restore_stream(
        self,
        memories: Iterable[MemoryView],
        progress: Callable[[int], None] | None = None,
        counts: Counter[str] | None = None,
        batch: int = RESTORE_BATCH,
    ) -> int:
        """:meth:`restore` for memories checked already, read as they come (an import of millions): embedded and
        written ``batch`` at a time; ``progress(done)`` after each batch, ``counts`` per namespace."""
        done = 0
        stream = iter(memories)
        with self._call():
            while chunk := list(itertools.islice(stream, batch)):
                points = []
                for namespace, group in itertools.groupby(
                    sorted(chunk, key=lambda m: m.namespace), lambda m: m.namespace
                ):
                    same = list(group)
                    vectors = self._embed_tasks([m.task for m in same], namespace)
                    points += [Point(m.id, v, memory_payload(m)) for m, v in zip(same, vectors, strict=True)]
                    if counts is not None:
                        counts[namespace] += len(same)
                self._store.upsert("memories", points)
                done += len(chunk)
                if progress is not None:
                    progress(done)
        return done

    # -- validation -----------------------------------------------------------------------------

    def _namespace(self, namespace: str | None, access: Access) -> str:
        if namespace is None:
            namespace = access.default or self.settings.namespace
        namespace = NAMESPACE.check("namespace", namespace)
        if not access.allows(namespace):
            raise MemoryRequestError(f"namespace: {namespace!r} is not one of the namespaces this token may use")
        return namespace

    def _metadata(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        if metadata is None:
            return {}
        return self.limits.metadata.check("metadata", dict(metadata) if isinstance(metadata, Mapping) else metadata)


def _check_outcome(outcome: str) -> None:
    if outcome not in ("success", "failure"):
        raise MemoryRequestError(f"outcome: must be 'success' or 'failure', got {outcome!r}")


def _is_point_id(text: str) -> bool:
    try:
        POINT_ID.check("id", text)
    except MemoryRequestError:
        return False
    return True
