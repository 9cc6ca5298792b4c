"""The memory service: MemRL's loop (recall -> act -> report) over an embedder and a Qdrant store.

Safe for concurrent callers: threads of one server, and replicas of the server sharing one Qdrant server.
No process-wide lock guards the learned state; every read-modify-write of a memory is optimistic:

- each memory carries a ``version``; a write is conditional on the version it read (``Store.set_payload_if``)
  and is read back; a writer that lost the race reads again and retries, so no reward is lost;
- each memory also lists the last operations folded into it (``applied``), so an operation that is retried
  or redone is never applied twice;
- a recall is claimed for its report by a conditional write ``pending -> applying`` carrying a fresh claim id,
  so of two replicas reporting one recall exactly one wins. The claimed recall record holds the reward and the
  experience: it is the redo log. A report interrupted by a crash is finished by the next server to open the
  store (every step is idempotent), then the recall is marked ``reported``.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from memrl_mcp import algorithm
from memrl_mcp.embeddings import Embedder, create_embedder
from memrl_mcp.models import (
    ForgetResult,
    MemoryView,
    Outcome,
    QChange,
    QSummary,
    RecalledMemory,
    RecallResult,
    ReportResult,
    Stats,
    StoreResult,
)
from memrl_mcp.settings import MAX_K, NAMESPACE_PATTERN, Settings
from memrl_mcp.storage import Point, Store, new_id, open_store

RECALL_PENDING, RECALL_APPLYING, RECALL_REPORTED = "pending", "applying", "reported"
PURGE_INTERVAL_SECONDS = 3600.0  # how often a running server drops expired recalls and finishes stale reports
STALE_REPORT_SECONDS = 60.0  # a report still "applying" after this long was interrupted: finish it
APPLIED_KEPT = 64  # operations a memory remembers having applied: more than any retry can race past
WRITE_ATTEMPTS = 200  # optimistic write retries before giving up on a memory (contention, not an error)


class MemoryRequestError(ValueError):
    """A request was refused (bad input, unknown or spent recall); nothing was changed."""


@dataclass(frozen=True)
class Access:
    """The namespaces a caller may use (from its bearer token), and the one used when a call names none.

    ``namespaces=None`` is every namespace: a local caller (stdio, an in-process client, a server without
    tokens). Memories and recalls outside a caller's namespaces are reported as unknown, never as forbidden,
    so their existence does not leak."""

    namespaces: frozenset[str] | None = None
    default: str | None = None

    def allows(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


EVERYTHING = Access()


class MemoryService:
    """recall / report / store / forget / stats over one store, with MemRL's scoring and update."""

    def __init__(
        self, settings: Settings, embedder: Embedder, store: Store, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self.write_conflicts = 0  # optimistic writes that lost a race and were retried (a metric)
        self._store = store
        self._clock = clock
        self._rng = random.Random(settings.seed)
        # One store_experience at a time per process, so that two stores of one task make one memory.
        self._store_lock = threading.Lock()
        self._calls = threading.Condition()
        self._active_calls = 0
        self._closed = False
        profile = embedder.similarity
        self.delta = profile.delta if settings.delta is None else settings.delta
        self.merge_threshold = profile.merge if settings.merge_threshold is None else settings.merge_threshold
        self.scale = algorithm.SimilarityScale(
            mode=settings.sim_normalization,
            mean=profile.mean if settings.sim_mean is None else settings.sim_mean,
            std=profile.std if settings.sim_std is None else settings.sim_std,
        )
        # An embedded store is this process's alone: whatever is still "applying" was interrupted. On a
        # Qdrant server another replica may be mid-report: finish only reports left for a while.
        self._housekeeping(stale_after=STALE_REPORT_SECONDS if settings.qdrant_url else 0.0)

    @classmethod
    def open(cls, settings: Settings) -> Self:
        """Build the embedder and open the store the settings name."""
        embedder = create_embedder(settings)
        return cls(settings, embedder, open_store(settings, embedder.dim))

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

    def _housekeeping(self, stale_after: float) -> None:
        """Finish reports interrupted by a crash, drop expired recalls."""
        now = self._clock()
        for recall_id, recall in list(self._store.scroll("recalls", {"status": RECALL_APPLYING})):
            if now - float(recall["reported_at"]) >= stale_after:
                self._apply_report(recall_id, recall)
        self._store.purge_recalls(expired_before=now)
        self._housekept_at = now

    def _embed_tasks(self, tasks: Sequence[str]) -> np.ndarray:
        """Embed the tasks' canonical forms, so that spacing and a trailing full stop make no twin
        (MiniLM puts "x." and "x" as far as 0.90 apart, while distinct tasks reach 0.98)."""
        canonical = [" ".join(task.split()).rstrip(".!;, ") or task.strip() for task in tasks]
        return self.embedder.embed(canonical)

    def _embed_task(self, task: str) -> np.ndarray:
        return self._embed_tasks([task])[0]

    # -- recall ---------------------------------------------------------------------------------

    def recall(
        self,
        task: str,
        namespace: str | None = None,
        k1: int | None = None,
        k2: int | None = None,
        q_weight: float | None = None,
        delta: float | None = None,
        access: Access = EVERYTHING,
    ) -> RecallResult:
        """Phase A (similarity >= delta, top-k1), then Phase B (value-aware top-k2); logs the recall."""
        s = self.settings
        task = self._text("task", task, s.max_task_chars)
        namespace = self._namespace(namespace, access)
        k1 = _int_in("k1", s.k1 if k1 is None else k1, 1, MAX_K)
        k2 = _int_in("k2", s.k2 if k2 is None else k2, 1, k1)
        q_weight = _float_in("q_weight", s.q_weight if q_weight is None else q_weight, 0.0, 1.0)
        delta = _float_in("delta", self.delta if delta is None else delta, -1.0, 1.0)

        with self._call():
            vector = self._embed_task(task)
            hits = self._store.search(vector, k1, delta, {"namespace": namespace})
            pool = [algorithm.Candidate(h.similarity, float(h.payload["q"])) for h in hits]
            chosen, scores, explored = algorithm.select(pool, k2, q_weight, self.scale, s.epsilon, self._rng)

            now = self._clock()
            if now - self._housekept_at > PURGE_INTERVAL_SECONDS:
                self._housekeeping(stale_after=STALE_REPORT_SECONDS)
            recall_id = new_id()
            memories = [
                RecalledMemory(
                    **_view(hits[i].id, hits[i].payload).model_dump(),
                    similarity=hits[i].similarity,
                    score=float(scores[i]),
                )
                for i in chosen
            ]
            record = {
                "namespace": namespace,
                "task": task,
                "memory_ids": [m.id for m in memories],
                # The memory this task's experience would merge into, per outcome: Phase A already
                # searched around this very vector, so the report need not search again.
                "twins": {h.payload["outcome"]: h.id for h in reversed(hits) if h.similarity >= self.merge_threshold},
                "status": RECALL_PENDING,
                "created_at": now,
                "expires_at": now + s.recall_ttl_seconds,
            }
            self._store.upsert("recalls", [Point(recall_id, vector, record)])
        return RecallResult(
            recall_id=recall_id, namespace=namespace, candidates=len(pool), explored=explored, memories=memories
        )

    # -- report ---------------------------------------------------------------------------------

    def report(
        self,
        recall_id: str,
        reward: float,
        experience: str | None = None,
        outcome: Outcome | None = None,
        metadata: Mapping[str, Any] | None = None,
        access: Access = EVERYTHING,
    ) -> ReportResult:
        """Q <- Q + alpha (R - Q) on the recalled memories, once; then store the new experience."""
        s = self.settings
        reward = _float_in("reward", reward, s.reward_min, s.reward_max)
        if experience is not None:
            experience = self._text("experience", experience, s.max_experience_chars)
            outcome = outcome or ("success" if reward > 0 else "failure")
        if outcome is not None:
            _check_outcome(outcome)
        meta = self._metadata(metadata)
        with self._call():
            recall = self._recall_to_report(recall_id, access)
            claim = new_id()
            entry = {
                "status": RECALL_APPLYING,
                "claim": claim,
                "reward": reward,
                "reported_at": self._clock(),
                "experience": experience,
                "outcome": outcome,
                "report_metadata": meta,
            }
            self._store.set_payload_if("recalls", recall_id, entry, {"status": RECALL_PENDING})
            recall = self._store.get("recalls", [recall_id]).get(recall_id)
            if recall is None or recall.get("claim") != claim:
                raise MemoryRequestError(
                    f"recall_id: recall {recall_id} was already reported; a recall is reported once"
                )
            changes, missing, stored = self._apply_report(recall_id, recall)
        return ReportResult(recall_id=recall_id, reward=reward, updated=changes, missing=missing, stored=stored)

    def _recall_to_report(self, recall_id: str, access: Access) -> dict[str, Any]:
        recall = self._store.get("recalls", [recall_id]).get(recall_id) if _is_uuid(recall_id) else None
        if recall is None or not access.allows(recall["namespace"]):
            raise MemoryRequestError(f"recall_id: unknown recall {recall_id!r} (never issued, or expired and purged)")
        if recall["status"] != RECALL_PENDING:
            raise MemoryRequestError(
                f"recall_id: recall {recall_id} was already reported (reward {recall.get('reward')}); "
                "a recall is reported once"
            )
        if recall["expires_at"] < self._clock():
            raise MemoryRequestError(
                f"recall_id: recall {recall_id} expired (recall_ttl_seconds={self.settings.recall_ttl_seconds:g})"
            )
        return recall

    def _apply_report(
        self, recall_id: str, recall: Mapping[str, Any]
    ) -> tuple[list[QChange], list[str], StoreResult | None]:
        """Everything a claimed report does, idempotently: run by the reporter, or again after a crash."""
        reward, now = float(recall["reward"]), float(recall["reported_at"])
        alpha = self.settings.alpha
        changes, missing = [], []
        for memory_id in recall["memory_ids"]:
            written = self._update_memory(
                memory_id,
                f"q:{recall_id}",
                lambda m: {
                    "q": algorithm.update_q(float(m["q"]), reward, alpha),
                    "visits": int(m["visits"]) + 1,
                    "last_reward": reward,
                    "updated_at": now,
                },
            )
            if written is None:
                missing.append(memory_id)
            elif written[1] is not None:
                before, after = written
                changes.append(
                    QChange(id=memory_id, q_before=float(before["q"]), q_after=after["q"], visits=after["visits"])
                )
        stored = None
        if recall.get("experience") is not None:
            stored = self._store_reported_experience(recall_id, recall)
        self._store.set_payload("recalls", recall_id, {"status": RECALL_REPORTED})
        return changes, missing, stored

    def _store_reported_experience(self, recall_id: str, recall: Mapping[str, Any]) -> StoreResult:
        """Merge into the twin the recall saw, or add a memory whose id derives from the recall (so a redo
        finds it instead of adding it twice)."""
        experience, meta, now = recall["experience"], recall.get("report_metadata") or {}, float(recall["reported_at"])
        twin_id = recall.get("twins", {}).get(recall["outcome"])
        if twin_id is not None:
            merged = self._merge(twin_id, f"merge:{recall_id}", experience, meta, now)
            if merged is not None:
                return merged
        memory_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-recall:{recall_id}"))
        existing = self._store.get("memories", [memory_id]).get(memory_id)
        if existing is not None:
            return StoreResult(id=memory_id, merged=False, memory=_view(memory_id, existing))
        vector = self._store.get_vector("recalls", recall_id)
        assert vector is not None, "a recall point always has its query vector"
        return self._add(
            memory_id, recall["namespace"], recall["task"], vector, experience, recall["outcome"], None, meta, now
        )

    def _update_memory(
        self, memory_id: str, operation: str, change: Callable[[Mapping[str, Any]], dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """Apply ``change`` to a memory once, however many writers race: (before, written), (now, None) when
        ``operation`` was applied already, None when the memory is gone."""
        for attempt in range(WRITE_ATTEMPTS):
            before = self._store.get("memories", [memory_id]).get(memory_id)
            if before is None:
                return None
            applied = list(before.get("applied", []))
            if operation in applied:
                return before, None
            version = int(before.get("version", 0))
            update = {**change(before), "version": version + 1, "applied": [*applied, operation][-APPLIED_KEPT:]}
            self._store.set_payload_if("memories", memory_id, update, {"version": version})
            after = self._store.get("memories", [memory_id]).get(memory_id)
            if after is None:
                return None
            if operation in after.get("applied", []):
                return before, update
            self.write_conflicts += 1
            time.sleep(random.uniform(0, 0.0005 * min(attempt + 1, 20)))  # not self._rng: exploration stays seeded
        raise RuntimeError(f"memory {memory_id}: {WRITE_ATTEMPTS} concurrent writers in a row won the race")

    # -- store ----------------------------------------------------------------------------------

    def store_experience(
        self,
        task: str,
        experience: str,
        namespace: str | None = None,
        outcome: Outcome = "success",
        q: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        access: Access = EVERYTHING,
    ) -> StoreResult:
        """Add a memory directly (seeding, imports); a near-duplicate task with the same outcome merges."""
        s = self.settings
        task = self._text("task", task, s.max_task_chars)
        experience = self._text("experience", experience, s.max_experience_chars)
        namespace = self._namespace(namespace, access)
        _check_outcome(outcome)
        if q is not None:
            q = _float_in("q", q, s.reward_min, s.reward_max)
        meta = self._metadata(metadata)
        with self._call():
            vector = self._embed_task(task)
            with self._store_lock:
                now = self._clock()
                twins = self._store.search(
                    vector, 1, self.merge_threshold, {"namespace": namespace, "outcome": outcome}
                )
                if twins:
                    merged = self._merge(twins[0].id, f"merge:{new_id()}", experience, meta, now)
                    if merged is not None:
                        return merged
                return self._add(new_id(), namespace, task, vector, experience, outcome, q, meta, now)

    def _merge(
        self, memory_id: str, operation: str, experience: str, metadata: Mapping[str, Any], now: float
    ) -> StoreResult | None:
        """Merge rule: a memory of the same namespace and outcome whose task is at least
        ``merge_threshold`` similar is the same memory; it takes the newer experience and metadata
        and keeps its id, learned Q and visits. None when the twin was forgotten meanwhile."""
        written = self._update_memory(
            memory_id,
            operation,
            lambda m: {
                "experience": experience,
                "metadata": {**m.get("metadata", {}), **metadata},
                "merges": int(m.get("merges", 0)) + 1,
                "updated_at": now,
            },
        )
        if written is None:
            return None
        before, update = written
        return StoreResult(id=memory_id, merged=True, memory=_view(memory_id, {**before, **(update or {})}))

    def _add(
        self,
        memory_id: str,
        namespace: str,
        task: str,
        vector: np.ndarray,
        experience: str,
        outcome: Outcome,
        q: float | None,
        metadata: Mapping[str, Any],
        now: float,
    ) -> StoreResult:
        """A new memory, at Q_init for its outcome unless ``q`` is given."""
        if q is None:
            q = self.settings.q_init_success if outcome == "success" else self.settings.q_init_failure
        view = MemoryView(
            id=memory_id,
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
            metadata=dict(metadata),
        )
        self._store.upsert("memories", [Point(memory_id, vector, _payload(view))])
        return StoreResult(id=memory_id, merged=False, memory=view)

    # -- forget, read, stats, backup ------------------------------------------------------------

    def forget(
        self, memory_id: str | None = None, namespace: str | None = None, access: Access = EVERYTHING
    ) -> ForgetResult:
        """Delete one memory by id, or every memory and recall of a namespace (exactly one of the two)."""
        if (memory_id is None) == (namespace is None):
            raise MemoryRequestError("give exactly one of memory_id (one memory) or namespace (all of it)")
        with self._call():
            if memory_id is not None:
                self.get(memory_id, access)
                self._store.delete("memories", [memory_id])
                return ForgetResult(deleted=1)
            where = {"namespace": self._namespace(namespace, access)}
            deleted = self._store.count("memories", where)
            self._store.delete_where("memories", where)
            self._store.delete_where("recalls", where)
            return ForgetResult(deleted=deleted)

    def get(self, memory_id: str, access: Access = EVERYTHING) -> MemoryView:
        payload = self._store.get("memories", [memory_id]).get(memory_id) if _is_uuid(memory_id) else None
        if payload is None or not access.allows(payload["namespace"]):
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r}")
        return _view(memory_id, payload)

    def stats(self, namespace: str | None = None, access: Access = EVERYTHING) -> Stats:
        """Of one namespace, or of every namespace the caller may use."""
        where: dict[str, Any] = {}
        if namespace is not None:
            where["namespace"] = self._namespace(namespace, access)
        elif access.namespaces is not None:
            where["namespace"] = sorted(access.namespaces)
        payloads = [payload for _, payload in self._store.scroll("memories", where, ("q", "visits", "outcome"))]
        qs = np.array([float(p["q"]) for p in payloads])
        summary = None
        if qs.size:
            p25, median, p75 = np.percentile(qs, [25, 50, 75])
            summary = QSummary(
                min=float(qs.min()),
                p25=float(p25),
                median=float(median),
                p75=float(p75),
                max=float(qs.max()),
                mean=float(qs.mean()),
            )
        successes = sum(1 for p in payloads if p["outcome"] == "success")
        return Stats(
            namespace=namespace,
            memories=len(payloads),
            successes=successes,
            failures=len(payloads) - successes,
            q=summary,
            visits=sum(int(p["visits"]) for p in payloads),
            recalls_pending=self._store.count("recalls", {**where, "status": RECALL_PENDING}),
            recalls_reported=self._store.count("recalls", {**where, "status": RECALL_REPORTED}),
        )

    def count(self) -> int:
        """Memories stored, in every namespace (a metric)."""
        return self._store.count("memories")

    def memories(self, namespace: str | None = None) -> Iterator[MemoryView]:
        """Every memory (of one namespace, or all), in storage order: what an export writes."""
        where = None if namespace is None else {"namespace": self._namespace(namespace)}
        for memory_id, payload in self._store.scroll("memories", where):
            yield _view(memory_id, payload)

    def check_memory(self, memory: MemoryView) -> None:
        """Refuse a memory to restore that the tools could not have stored; the message names the field."""
        s = self.settings
        if not _is_uuid(memory.id):
            raise MemoryRequestError(f"id: {memory.id!r} is not a UUID")
        self._namespace(memory.namespace)
        self._text("task", memory.task, s.max_task_chars)
        self._text("experience", memory.experience, s.max_experience_chars)
        _float_in("q", memory.q, s.reward_min, s.reward_max)
        if memory.last_reward is not None:
            _float_in("last_reward", memory.last_reward, s.reward_min, s.reward_max)
        _int_in("visits", memory.visits, 0, 2**53)
        _int_in("merges", memory.merges, 0, 2**53)
        _float_in("created_at", memory.created_at, 0.0, math.inf)
        _float_in("updated_at", memory.updated_at, 0.0, math.inf)
        self._metadata(memory.metadata)

    def restore(self, memories: Sequence[MemoryView], batch: int = 64) -> int:
        """Write memories exactly as given (same id, Q, visits, timestamps), re-embedding their tasks.
        A memory whose id is already stored is replaced. Every memory is checked before any is written."""
        for memory in memories:
            self.check_memory(memory)
        with self._call():
            for start in range(0, len(memories), batch):
                chunk = memories[start : start + batch]
                vectors = self._embed_tasks([m.task for m in chunk])
                self._store.upsert(
                    "memories", [Point(m.id, v, _payload(m)) for m, v in zip(chunk, vectors, strict=True)]
                )
        return len(memories)

    # -- validation -----------------------------------------------------------------------------

    def _namespace(self, namespace: str | None, access: Access = EVERYTHING) -> str:
        if namespace is None:
            namespace = access.default or self.settings.namespace
        if not isinstance(namespace, str) or not re.fullmatch(NAMESPACE_PATTERN, namespace):
            raise MemoryRequestError(f"namespace: {namespace!r} must be 1-64 characters of letters, digits and _ . : -")
        if not access.allows(namespace):
            raise MemoryRequestError(f"namespace: {namespace!r} is not one of the namespaces this token may use")
        return namespace

    @staticmethod
    def _text(field: str, value: str, limit: int) -> str:
        if not isinstance(value, str) or not value.strip():
            raise MemoryRequestError(f"{field}: must be non-empty text")
        if len(value) > limit:
            raise MemoryRequestError(f"{field}: {len(value)} characters exceeds the limit of {limit}")
        return value

    def _metadata(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        if metadata is None:
            return {}
        try:
            encoded = json.dumps(dict(metadata), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise MemoryRequestError(f"metadata: must be a JSON object without NaN or infinity ({error})") from None
        if len(encoded) > self.settings.max_metadata_chars:
            raise MemoryRequestError(
                f"metadata: {len(encoded)} characters as JSON exceeds the limit of {self.settings.max_metadata_chars}"
            )
        return json.loads(encoded)


def _payload(memory: MemoryView) -> dict[str, Any]:
    """A memory as stored: its fields, plus the version and applied operations of optimistic writes."""
    return {**memory.model_dump(exclude={"id"}), "version": 0, "applied": []}


def _view(memory_id: str, payload: Mapping[str, Any]) -> MemoryView:
    return MemoryView(
        id=memory_id,
        namespace=payload["namespace"],
        task=payload["task"],
        experience=payload["experience"],
        outcome=payload["outcome"],
        q=float(payload["q"]),
        visits=int(payload["visits"]),
        last_reward=payload.get("last_reward"),
        merges=int(payload.get("merges", 0)),
        created_at=float(payload["created_at"]),
        updated_at=float(payload["updated_at"]),
        metadata=dict(payload.get("metadata") or {}),
    )


def _check_outcome(outcome: str) -> None:
    if outcome not in ("success", "failure"):
        raise MemoryRequestError(f"outcome: must be 'success' or 'failure', got {outcome!r}")


def _int_in(field: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MemoryRequestError(f"{field}: must be an integer in [{low}, {high}], got {value!r}")
    return value


def _float_in(field: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MemoryRequestError(f"{field}: must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise MemoryRequestError(f"{field}: {value!r} is outside [{low:g}, {high:g}]")
    return float(value)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except (ValueError, TypeError, AttributeError):
        return False
    return True
