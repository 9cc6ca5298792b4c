"""The memory service: MemRL's loop (recall -> act -> report) over an embedder and a Qdrant store.

Safe for concurrent callers: threads of one server, and replicas of the server sharing one Qdrant server. The
learned state is written only through :mod:`memrl_mcp.optimistic` (conditional writes, claimed reports that are
their own redo log); every input passes the rules of :mod:`memrl_mcp.validation`; the tables' records are typed
in :mod:`memrl_mcp.records`. Every method that serves a caller takes the caller's :class:`Access`, required.

Unreported recalls are bounded: one expires after ``recall_ttl_seconds``, and a namespace keeps at most
``max_pending_recalls`` pending (the oldest go first), so a client that never reports cannot grow the store
without limit. Reported episodes of the step memory likewise: a namespace keeps the newest
``max_reported_episodes`` (a report of an episode id dropped before is applied as a new episode).
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import json
import logging
import math
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Self

import numpy as np
from pydantic import BaseModel

from memrl_mcp import algorithm
from memrl_mcp.access import Access
from memrl_mcp.embeddings import Embedder, create_embedder, embed_tasks
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.migrations import SCHEMA_POINT, migrate
from memrl_mcp.models import (
    EffectiveSettings,
    ForgetResult,
    MemoryDetail,
    MemoryPage,
    MemoryView,
    Outcome,
    QEvent,
    RecalledMemory,
    RecallResult,
    ReportResult,
    SearchResult,
    SortKey,
    Stats,
    StepAdviceResult,
    StepRecordView,
    StoreResult,
    TrajectoryResult,
)
from memrl_mcp.optimistic import Ledger, NewMemory
from memrl_mcp.quota import UPDATE_BYTES, Quotas, new_record_bytes, record_bytes, text_bytes
from memrl_mcp.records import (
    ClaimedReport,
    RecallRecord,
    StepPayload,
    memory_detail,
    memory_payload,
    memory_view,
    with_event,
)
from memrl_mcp.settings import Settings, TokenGrant, load_grants
from memrl_mcp.steps import StepMemory, StepRules, step_id
from memrl_mcp.storage import DiskFullError, Hit, Point, Range, Store, Table, Where, Words, new_id, open_store
from memrl_mcp.tally import q_summary
from memrl_mcp.validation import (
    COUNT,
    DELTA,
    EPISODE_ID,
    FINITE,
    FLAG,
    NAMESPACE,
    POINT_ID,
    Q_WEIGHT,
    SORT,
    TEXT_QUERY,
    TIMESTAMP,
    K,
    Limits,
)

PURGE_INTERVAL_SECONDS = 3600.0  # how often a running server drops expired recalls and finishes stale reports
STALE_REPORT_SECONDS = 60.0  # a report still "applying" after this long was interrupted: finish it
RESTORE_BATCH = 256  # memories or step records an import embeds and writes together
EVICT_DOWN_TO = 0.9  # of a bound (OldestBeyond): what an eviction leaves, so the next count is a tenth of it away
DEFAULT_PAGE = 20  # memories a list_memories page returns when the caller names no limit (at most max_list_page)
log = logging.getLogger(__name__)


class OldestBeyond:
    """At most ``bound`` points of one kind (those of ``table`` matching ``where``) per namespace: once a namespace has
    more, the oldest by ``age`` go, down to :data:`EVICT_DOWN_TO` of the bound. Pending recalls (a report of one
    dropped is refused as expired) and reported episodes (a report of one dropped is applied as a new episode).

    Counting is a scan in qdrant-client's local mode (160 ms at 1000 recalls, against 0.2 ms on qdrant-edge), so a
    process counts a namespace only once the points it added since the last count could have reached the bound
    (nothing else adds them). Replicas on one Qdrant server may each add that many between counts."""

    def __init__(self, store: Store, table: Table, where: Where, age: str, bound: int) -> None:
        self._store = store
        self._table = table
        self._where = where
        self._age = age
        self._bound = bound
        self._budget: dict[str, int] = {}  # per namespace, additions to go before counting it again

    def added(self, namespace: str) -> None:
        """After adding one point of the kind to ``namespace``."""
        budget = self._budget.get(namespace, 0)
        if budget > 0:
            self._budget[namespace] = budget - 1
            return
        where = {**self._where, "namespace": namespace}
        count = self._store.count(self._table, where)
        if count > self._bound:
            ages = sorted(
                (float(payload[self._age]), point_id)
                for point_id, payload in self._store.scroll(self._table, where, (self._age,))
            )
            keep = int(self._bound * EVICT_DOWN_TO)
            self._store.delete(self._table, [point_id for _, point_id in ages[: max(len(ages) - keep, 0)]])
            count = min(count, keep)
        self._budget[namespace] = self._bound - count


class MemoryService:
    """recall / report / store / forget / stats over one store, with MemRL's scoring and update.

    The constructor does no I/O; :meth:`open` builds the parts and finishes what a crash interrupted."""

    def __init__(
        self,
        settings: Settings,
        embedder: Embedder,
        store: Store,
        clock: Callable[[], float] = time.time,
        grants: Sequence[TokenGrant] | None = None,
    ) -> None:
        """``grants``: the tokens whose ``namespace_quota_mb`` set their namespaces' quotas (None: the settings'
        ``tokens``; :meth:`open` also reads ``tokens_file``)."""
        self.settings = settings
        self.embedder = embedder
        self.limits = Limits(
            settings.max_task_chars,
            settings.max_experience_chars,
            settings.max_metadata_chars,
            (settings.reward_min, settings.reward_max),
            (settings.max_trajectory_steps, settings.max_observation_chars, settings.max_action_chars),
            settings.max_list_page,
        )
        self._store = store
        self.quotas = Quotas(store, settings.namespace_quota_mb, settings.tokens if grants is None else grants)
        self._ledger = Ledger(store)
        self._clock = clock
        self._rng = random.Random(settings.seed)
        # One store_experience at a time per process, so that two stores of one task make one memory.
        self._store_lock = threading.Lock()
        self._calls = threading.Condition()
        self._active_calls = 0
        self._closed = False
        self._housekept_at = -float("inf")
        self._pending = OldestBeyond(
            store, "recalls", {"status": "pending"}, "created_at", settings.max_pending_recalls
        )
        self._reported = OldestBeyond(
            store, "episodes", {"status": "reported"}, "reported_at", settings.max_reported_episodes
        )
        profile = embedder.similarity
        self.delta = profile.delta if settings.delta is None else settings.delta
        self.merge_threshold = profile.merge if settings.merge_threshold is None else settings.merge_threshold
        self.scale = algorithm.SimilarityScale(
            mode=settings.sim_normalization,
            mean=profile.mean if settings.sim_mean is None else settings.sim_mean,
            std=profile.std if settings.sim_std is None else settings.sim_std,
        )
        self._new_memory = NewMemory(
            settings.q_init_success, settings.q_init_failure, settings.max_metadata_chars, settings.q_history_size
        )
        self.step_delta = self.delta if settings.step_delta is None else settings.step_delta
        self.steps = StepMemory(
            store,
            self._ledger,
            StepRules(
                n=settings.step_n,
                gamma=settings.step_gamma,
                update=settings.step_update,
                learning_rate=settings.step_learning_rate,
                observation_weight=settings.step_observation_weight,
                match_threshold=settings.step_match_threshold,
                advice_threshold=settings.step_advice_threshold,
                max_records=settings.step_max_records,
                max_actions=settings.step_max_actions,
                embed_chars=settings.step_embed_chars,
            ),
            embedder=embedder,
            # The ledger's, not a method of this service: no reference cycle, so a dropped service closes at once.
            report_recall=functools.partial(self._ledger.report, alpha=settings.alpha, new=self._new_memory),
        )

    @classmethod
    def open(
        cls,
        settings: Settings,
        embedder: Embedder | None = None,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Self:
        """Build the embedder and open the store the settings name (unless given), bring its schema up to date
        (:mod:`memrl_mcp.migrations`), then recover: an embedded store is this process's alone, so whatever is
        still "applying" was interrupted and is finished now; on a Qdrant server another replica may be
        mid-report, so only reports left for a while are. A recovery refused for want of disk space is left for
        later (the next open, or the hourly housekeeping of recall): a full disk must not stop the reads.

        ``read_only`` writes nothing: a store that needs a migration is refused, and what a crash interrupted is
        left for a writable server to finish (reads show it as it stands)."""
        embedder = embedder or create_embedder(settings)
        grants = load_grants(settings)
        service = cls(settings, embedder, store or open_store(settings, embedder.dim), clock, grants)
        try:
            migrate(service._store, embedder.dim, read_only=settings.read_only)
            if not settings.read_only:
                try:
                    service.housekeeping(stale_after=STALE_REPORT_SECONDS if settings.qdrant_url else 0.0)
                except DiskFullError as error:
                    log.warning("interrupted reports are left unfinished until there is room: %s", error)
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
        self.steps.housekeeping(now, stale_after)
        self._store.purge_recalls(expired_before=now)
        self._housekept_at = now

    def _embed_tasks(self, tasks: Sequence[str], namespace: str) -> np.ndarray:
        """Embed the tasks' canonical forms, in the namespace's partition of the cache (embeddings.embed_tasks)."""
        return embed_tasks(self.embedder, tasks, namespace)

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
            payload = record.payload()
            with self.quotas.admit(result.namespace, record_bytes(payload, vector.size)):
                self._store.upsert("recalls", [Point(recall_id, vector, payload)])
            self._pending.added(result.namespace)
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
            recall = self._recall_to_report(recall_id, access)
            report = ClaimedReport(
                claim=new_id(),
                reward=reward,
                reported_at=self._clock(),
                experience=experience,
                outcome=outcome,
                metadata=meta,
            )
            with self.quotas.admit(recall.namespace, self._report_bytes(recall, experience, meta)):
                return self._ledger.report(recall_id, report, self.settings.alpha, self._new_memory)

    def _report_bytes(self, recall: RecallRecord, experience: str | None, metadata: Mapping[str, Any]) -> int:
        """What reporting ``recall`` may add: the report in the recall's record, a Q update per recalled memory,
        and the new memory of ``experience``."""
        added = new_record_bytes(experience, metadata, dims=0) + UPDATE_BYTES * len(recall.memory_ids)
        if experience is not None:
            added += new_record_bytes(recall.task, experience, metadata, dims=self.embedder.dim)
        return added

    def _recall_to_report(self, recall_id: str, access: Access) -> RecallRecord:
        payload = self._store.get("recalls", [recall_id]).get(recall_id) if _is_point_id(recall_id) else None
        recall = None if payload is None or recall_id == SCHEMA_POINT else RecallRecord.model_validate(payload)
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

    # -- the step memory (Rememberer) ----------------------------------------------------------

    def recall_step_advice(
        self, task: str, observation: str, namespace: str | None = None, k: int | None = None, *, access: Access
    ) -> StepAdviceResult:
        """Encouraged and discouraged actions for (task, observation), from the k best-matching step records.
        Read-only: nothing is logged (the trajectory report names its own steps)."""
        task = self.limits.task.check("task", task)
        observation = self.limits.observation.check("observation", observation)
        k = K.check("k", self.settings.step_k if k is None else k)
        namespace = self._namespace(namespace, access)
        with self._call():
            return self.steps.advise(task, observation, namespace, k, self.step_delta)

    def report_trajectory(
        self,
        task: str,
        steps: Sequence[Any],
        episode_id: str,
        namespace: str | None = None,
        recall_id: str | None = None,
        *,
        access: Access,
    ) -> TrajectoryResult:
        """Move every step's Q toward its n-step target, once per ``episode_id`` in the namespace; with
        ``recall_id``, also report that recall of the episode memory with the last step's reward, once."""
        task = self.limits.task.check("task", task)
        plain = [_plain(step) for step in steps] if isinstance(steps, list | tuple) else steps
        checked = self.limits.steps.check("steps", plain)
        episode_id = EPISODE_ID.check("episode_id", episode_id)
        if recall_id is not None and not isinstance(recall_id, str):
            raise MemoryRequestError(f"recall_id: must be a string, got {type(recall_id).__name__}")
        namespace = self._namespace(namespace, access)
        with self._call():
            already = self.steps.applied(namespace, episode_id)
            if already is not None:
                return already
            # The episode's record (task and every step), a step record per step, and the recall's report.
            added = new_record_bytes(task, [[s.observation, s.action] for s in checked], dims=1) + sum(
                new_record_bytes(task, s.observation, s.action, dims=2 * self.embedder.dim) for s in checked
            )
            if recall_id is not None:
                added += self._report_bytes(self._recall_to_report(recall_id, access), None, {})
            trajectory = [(step.observation, step.action, step.reward) for step in checked]
            with self.quotas.admit(namespace, added):
                result = self.steps.report(task, trajectory, episode_id, namespace, recall_id, self._clock())
            if not result.already_applied:
                self._reported.added(namespace)
            return result

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
        added = new_record_bytes(task, experience, meta, dims=self.embedder.dim)
        with self._call(), self.quotas.admit(namespace, added):
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
                    q = self._new_memory.q_init(outcome)
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
            forgotten = self._namespace(namespace, access)
            where = {"namespace": forgotten}
            self._store.delete_namespace("recalls", forgotten)
            self._store.delete_namespace("episodes", forgotten)
            deleted = self._store.count("memories", where)
            self._store.delete_namespace("memories", forgotten)
            steps_deleted = self._store.count("steps", where)
            self._store.delete_namespace("steps", forgotten)
            return ForgetResult(deleted=deleted, steps_deleted=steps_deleted)

    def get(self, memory_id: str, *, access: Access) -> MemoryDetail:
        """One memory with the history of its Q; another tenant's memory is as unknown as a missing one."""
        payload = self._store.get("memories", [memory_id]).get(memory_id) if _is_point_id(memory_id) else None
        if payload is None or not access.allows(payload["namespace"]):
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r}")
        return memory_detail(memory_id, payload)

    # -- list and correct -----------------------------------------------------------------------

    def list_memories(
        self,
        namespace: str | None = None,
        outcome: Outcome | None = None,
        q_min: float | None = None,
        q_max: float | None = None,
        text: str | None = None,
        sort: SortKey = "updated_at",
        descending: bool = True,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        access: Access,
    ) -> MemoryPage:
        """One page of a namespace's memories (default: the caller's), filtered and sorted.

        ``text``: full text, every word of it a word of the task or the experience (any order, any case).
        Pages are keyset-paged on (sort value, id): the engine orders by the indexed sort field (``order_by``),
        and ties, which are common (every new memory has Q = Q_init and 0 visits), are read in id order, so a
        page never repeats or skips a memory that did not change meanwhile; one whose sort value changed
        between pages moves with it."""
        namespace = self._namespace(namespace, access)
        where: dict[str | tuple[str, ...], Any] = {"namespace": namespace}
        if outcome is not None:
            _check_outcome(outcome)
            where["outcome"] = outcome
        q_range = Range(
            gte=None if q_min is None else self.limits.reward.check("q_min", q_min),
            lte=None if q_max is None else self.limits.reward.check("q_max", q_max),
        )
        if q_range.gte is not None and q_range.lte is not None and q_range.gte > q_range.lte:
            raise MemoryRequestError(f"q_min: {q_range.gte:g} exceeds q_max ({q_range.lte:g})")
        if q_range != Range():
            where["q"] = q_range
        if text is not None:
            where[("task", "experience")] = Words(TEXT_QUERY.check("text", text))
        sort = SORT.check("sort", sort)
        descending = FLAG.check("descending", descending)
        limit = self.limits.page.check(
            "limit", min(DEFAULT_PAGE, self.settings.max_list_page) if limit is None else limit
        )
        after = None if cursor is None else _decode_cursor(cursor, sort, descending)
        with self._call():
            rows = self._keyset_page(where, sort, descending, after, limit + 1)
            total = self._store.count("memories", where)
        page = [memory_view(memory_id, payload) for memory_id, payload in rows[:limit]]
        more = len(rows) > limit
        next_cursor = (
            _encode_cursor(sort, descending, float(rows[limit - 1][1][sort]), rows[limit - 1][0]) if more else None
        )
        return MemoryPage(namespace=namespace, total=total, memories=page, next_cursor=next_cursor)

    def _keyset_page(
        self, where: Where, sort: str, descending: bool, after: tuple[float, str] | None, want: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """Up to ``want`` memories after ``after`` in (sort value, id) order, the value descending or not, the
        id always ascending (the engines' scroll order)."""
        base: Range = where.get(sort, Range())  # type: ignore[assignment]

        def at(value: float) -> dict[str | tuple[str, ...], Any]:
            return {**where, sort: base & Range(gte=value - _tie(value), lte=value + _tie(value))}

        def beyond(value: float) -> dict[str | tuple[str, ...], Any]:
            edge = Range(lt=value - _tie(value)) if descending else Range(gt=value + _tie(value))
            return {**where, sort: base & edge}

        rows: list[tuple[str, dict[str, Any]]] = []
        rest = dict(where)
        if after is not None:  # the rest of the cursor's tie group, then what lies beyond it
            value, last_id = after
            group, _ = self._store.scroll_from("memories", at(value), last_id, want + 1)
            rows += [row for row in group if row[0] != last_id][:want]
            rest = beyond(value)
        while len(rows) < want:
            need = want - len(rows)
            batch = self._store.ordered("memories", rest, sort, descending, need)
            if not batch:
                break
            edge = float(batch[-1][1][sort])
            whole = [row for row in batch if abs(float(row[1][sort]) - edge) > _tie(edge)]  # groups before the last
            sign = -1.0 if descending else 1.0
            rows += sorted(whole, key=lambda row: (sign * float(row[1][sort]), uuid.UUID(row[0]).int))
            group, _ = self._store.scroll_from("memories", at(edge), None, need - len(whole))
            rows += group
            if len(group) == need - len(whole) or len(batch) < need:
                break
            rest = beyond(edge)
        return rows[:want]

    def update_memory(
        self,
        memory_id: str,
        experience: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        reset_q: bool = False,
        *,
        access: Access,
    ) -> MemoryDetail:
        """Correct a memory: replace its experience and/or its metadata (the rules of store_experience). Q and
        visits are learned, not edited: ``reset_q`` sets them back to Q_init and 0, recorded in the history.

        The edit is one conditional write (:meth:`Ledger.update_once`): a report folding a reward into the same
        memory at the same moment keeps its reward, and the edit keeps its text."""
        if experience is not None:
            experience = self.limits.experience.check("experience", experience)
        meta = None if metadata is None else self._metadata(metadata)
        reset = FLAG.check("reset_q", reset_q)
        if experience is None and meta is None and not reset:
            raise MemoryRequestError("give at least one of experience, metadata or reset_q=true: nothing to change")
        with self._call():
            namespace = self.get(memory_id, access=access).namespace
            now = self._clock()
            new = self._new_memory

            def edit(m: Mapping[str, Any]) -> dict[str, Any]:
                update: dict[str, Any] = {"updated_at": now}
                if experience is not None:
                    update["experience"] = experience
                if meta is not None:
                    update["metadata"] = meta
                if reset:
                    q_init = new.q_init(m["outcome"])
                    event = QEvent(
                        at=now, event="reset", reward=None, q_before=float(m["q"]), q_after=q_init, recall_id=None
                    )
                    history = with_event(m, event, new.history_size)
                    update |= {"q": q_init, "visits": 0, "last_reward": None, "history": history}
                return update

            with self.quotas.admit(namespace, text_bytes(experience, meta) + UPDATE_BYTES):
                written = self._ledger.update_once(memory_id, f"edit:{new_id()}", edit)
        if written is None:
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r} (it was forgotten meanwhile)")
        return memory_detail(memory_id, {**written.before, **(written.update or {})})

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
            steps=self._store.count("steps", where),
            episodes_reported=self._store.count("episodes", {**where, "status": "reported"}),
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
            step_n=s.step_n,
            step_gamma=s.step_gamma,
            step_update=s.step_update,
            step_learning_rate=s.step_learning_rate,
            step_observation_weight=s.step_observation_weight,
            step_k=s.step_k,
            step_delta=self.step_delta,
            step_match_threshold=s.step_match_threshold,
            step_advice_threshold=s.step_advice_threshold,
            step_max_records=s.step_max_records,
            step_max_actions=s.step_max_actions,
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

    def restore(self, memories: Sequence[MemoryView], batch: int = RESTORE_BATCH) -> int:
        """Write memories exactly as given (same id, Q, visits, timestamps), re-embedding their tasks.
        A memory whose id is already stored is replaced. Every memory is checked before any is written."""
        for memory in memories:
            self.check_memory(memory)
        with self._call(), self._admitted(self.restore_bytes(memories)):
            for start in range(0, len(memories), batch):
                chunk = sorted(memories[start : start + batch], key=lambda m: m.namespace)
                points = []
                for namespace, group in itertools.groupby(chunk, key=lambda m: m.namespace):
                    same = list(group)
                    vectors = self._embed_tasks([m.task for m in same], namespace)
                    points += [Point(m.id, v, memory_payload(m)) for m, v in zip(same, vectors, strict=True)]
                self._store.upsert("memories", points)
        return len(memories)

    def step_records(self) -> Iterator[StepRecordView]:
        """Every step record, in storage order: what an export writes after the memories."""
        for record_id, payload in self._store.scroll("steps"):
            yield StepPayload.model_validate(payload).view(record_id)

    def check_step(self, record: StepRecordView) -> None:
        """Refuse a step record to restore that reports could not have made; the message names the field."""
        POINT_ID.check("id", record.id)
        NAMESPACE.check("namespace", record.namespace)
        self.limits.task.check("task", record.task)
        self.limits.observation.check("observation", record.observation)
        if record.id != step_id(record.namespace, record.task, record.observation):
            raise MemoryRequestError("id: is not the id of its (namespace, task, observation); reports would miss it")
        if len(record.actions) > self.settings.step_max_actions:
            raise MemoryRequestError(
                f"actions: {len(record.actions)} exceed step_max_actions={self.settings.step_max_actions}"
            )
        if len({a.action for a in record.actions}) < len(record.actions):
            raise MemoryRequestError("actions: an action is listed twice (each action of a record is listed once)")
        for i, action in enumerate(record.actions):
            self.limits.action.check(f"actions[{i}].action", action.action)
            FINITE.check(f"actions[{i}].q", action.q)
            COUNT.check(f"actions[{i}].visits", action.visits)
            self.limits.reward.check(f"actions[{i}].reward", action.reward)
        TIMESTAMP.check("created_at", record.created_at)
        TIMESTAMP.check("updated_at", record.updated_at)

    def restore_steps(self, records: Sequence[StepRecordView]) -> int:
        """Write step records exactly as given, re-embedding their texts; every one is checked first."""
        for record in records:
            self.check_step(record)
        with self._call(), self._admitted(self.restore_bytes(records)):
            self.steps.restore(records)
        return len(records)

    def restore_bytes(self, records: Sequence[MemoryView | StepRecordView]) -> Counter[str]:
        """Per namespace, what restoring ``records`` adds: the size of those whose id is not stored yet (a
        resumed import replaces the others with the same)."""
        added: Counter[str] = Counter()
        for start in range(0, len(records), RESTORE_BATCH):
            chunk = records[start : start + RESTORE_BATCH]
            for table, kind in (("memories", MemoryView), ("steps", StepRecordView)):
                mine = [record for record in chunk if isinstance(record, kind)]
                stored = self._store.get(table, [record.id for record in mine], ())
                for record in mine:
                    if record.id not in stored:
                        added[record.namespace] += self._record_bytes(record)
        return added

    def _record_bytes(self, record: MemoryView | StepRecordView) -> int:
        if isinstance(record, MemoryView):
            return record_bytes(memory_payload(record), self.embedder.dim)
        step = StepPayload(**record.model_dump(exclude={"id"}))
        return record_bytes(step.model_dump(), 2 * self.embedder.dim)

    @contextmanager
    def _admitted(self, added: Mapping[str, int]) -> Iterator[None]:
        """Admission of a write that adds to several namespaces at once: all of them, or none."""
        with ExitStack() as stack:
            for namespace, size in sorted(added.items()):
                stack.enter_context(self.quotas.admit(namespace, size))
            yield

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


def _plain(step: Any) -> Any:
    """A step as the rules check it: a dict (the tools hand over their parsed model, Python callers dicts)."""
    return step.model_dump() if isinstance(step, BaseModel) else step


def _tie(value: float) -> float:
    """How far apart two sort values may be and count as equal (a tie group). qdrant-edge reads some floats back
    one ulp off the value its index holds (measured: 63 of 500 timestamps), so an exact match on a value read back
    can miss its own point."""
    return 4 * math.ulp(value)


def _encode_cursor(sort: str, descending: bool, value: float, memory_id: str) -> str:
    """An opaque cursor: where the page ended, in the order it was read (it grants nothing: every page is
    filtered by the caller's access again)."""
    raw = json.dumps([sort, descending, value, memory_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str, sort: str, descending: bool) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        cursor_sort, cursor_descending, value, memory_id = json.loads(raw)
        value = float(value)
        uuid.UUID(memory_id)
    except (binascii.Error, ValueError, TypeError, AttributeError):
        raise MemoryRequestError("cursor: not a cursor list_memories returned") from None
    if (cursor_sort, cursor_descending) != (sort, descending):
        raise MemoryRequestError(
            f"cursor: it continues a list sorted by {cursor_sort} (descending={cursor_descending}), not this "
            "one: pass the same sort and descending as for the first page"
        )
    return value, memory_id


def _check_outcome(outcome: str) -> None:
    if outcome not in ("success", "failure"):
        raise MemoryRequestError(f"outcome: must be 'success' or 'failure', got {outcome!r}")


def _is_point_id(text: str) -> bool:
    try:
        POINT_ID.check("id", text)
    except MemoryRequestError:
        return False
    return True
