"""The memory service: MemRL's loop (recall -> act -> report) over an embedder and a Qdrant store.

Thread-safe: the MCP server runs tools in worker threads. Reads (recall, stats) run in parallel;
writes that read-modify-write stored state (report, store, forget) hold one lock, so concurrent
reports on the same memories fold their rewards one after another and none is lost.

A report is made crash-safe by using the recall record as a redo log: it is first marked
``applying`` together with the absolute Q and visits it will write, then the memories are set,
then it is marked ``reported``. On open, any recall left ``applying`` is finished. A recall that is
``reported`` is refused, so no reward is applied twice.
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
from memrl_mcp.settings import MAX_K, Settings
from memrl_mcp.storage import Point, Store, new_id, open_store

NAMESPACE_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
RECALL_PENDING, RECALL_APPLYING, RECALL_REPORTED = "pending", "applying", "reported"
PURGE_INTERVAL_SECONDS = 3600.0  # how often a running server drops expired recalls


class MemoryRequestError(ValueError):
    """A request was refused (bad input, unknown or spent recall); nothing was changed."""


class MemoryService:
    """recall / report / store / forget / stats over one store, with MemRL's scoring and update."""

    def __init__(
        self, settings: Settings, embedder: Embedder, store: Store, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self._store = store
        self._clock = clock
        self._write_lock = threading.Lock()
        self._rng = random.Random(settings.seed)
        profile = embedder.similarity
        self.delta = profile.delta if settings.delta is None else settings.delta
        self.merge_threshold = profile.merge if settings.merge_threshold is None else settings.merge_threshold
        self.scale = algorithm.SimilarityScale(
            mode=settings.sim_normalization,
            mean=profile.mean if settings.sim_mean is None else settings.sim_mean,
            std=profile.std if settings.sim_std is None else settings.sim_std,
        )
        self._finish_interrupted_reports()
        self._purged_at = self._clock()
        store.purge_recalls(expired_before=self._purged_at)

    @classmethod
    def open(cls, settings: Settings) -> Self:
        """Build the embedder and open the store the settings name."""
        embedder = create_embedder(settings)
        return cls(settings, embedder, open_store(settings, embedder.dim))

    def close(self) -> None:
        with self._write_lock:
            self._store.close()

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
    ) -> RecallResult:
        """Phase A (similarity >= delta, top-k1), then Phase B (value-aware top-k2); logs the recall."""
        s = self.settings
        task = self._text("task", task, s.max_task_chars)
        namespace = self._namespace(namespace)
        k1 = _int_in("k1", s.k1 if k1 is None else k1, 1, MAX_K)
        k2 = _int_in("k2", s.k2 if k2 is None else k2, 1, k1)
        q_weight = _float_in("q_weight", s.q_weight if q_weight is None else q_weight, 0.0, 1.0)
        delta = _float_in("delta", self.delta if delta is None else delta, -1.0, 1.0)

        vector = self._embed_task(task)
        hits = self._store.search(vector, k1, delta, {"namespace": namespace})
        pool = [algorithm.Candidate(h.similarity, float(h.payload["q"])) for h in hits]
        chosen, scores, explored = algorithm.select(pool, k2, q_weight, self.scale, s.epsilon, self._rng)

        now = self._clock()
        if now - self._purged_at > PURGE_INTERVAL_SECONDS:
            self._store.purge_recalls(expired_before=now)
            self._purged_at = now
        recall_id = new_id()
        memories = [
            RecalledMemory(
                **_view(hits[i].id, hits[i].payload).model_dump(), similarity=hits[i].similarity, score=float(scores[i])
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
    ) -> ReportResult:
        """Q <- Q + alpha (R - Q) on the recalled memories, once; then store the new experience."""
        s = self.settings
        reward = _float_in("reward", reward, s.reward_min, s.reward_max)
        if experience is not None:
            experience = self._text("experience", experience, s.max_experience_chars)
        if outcome is not None:
            _check_outcome(outcome)
        meta = self._metadata(metadata)
        with self._write_lock:
            recall = self._pending_recall(recall_id)
            stored_ids = list(recall["memory_ids"])
            current = self._store.get("memories", stored_ids)
            changes = [
                QChange(
                    id=memory_id,
                    q_before=float(current[memory_id]["q"]),
                    q_after=algorithm.update_q(float(current[memory_id]["q"]), reward, s.alpha),
                    visits=int(current[memory_id]["visits"]) + 1,
                )
                for memory_id in stored_ids
                if memory_id in current
            ]
            now = self._clock()
            self._store.set_payload(
                "recalls",
                recall_id,
                {
                    "status": RECALL_APPLYING,
                    "reward": reward,
                    "reported_at": now,
                    "changes": [c.model_dump() for c in changes],
                },
            )
            self._apply_changes(changes, reward, now)
            self._store.set_payload("recalls", recall_id, {"status": RECALL_REPORTED})
            stored = None
            if experience is not None:
                outcome = outcome or ("success" if reward > 0 else "failure")
                twin_id = recall.get("twins", {}).get(outcome)
                twin = self._store.get("memories", [twin_id]).get(twin_id) if twin_id else None
                if twin is not None:
                    stored = self._merge(twin_id, twin, experience, meta)
                else:
                    vector = self._store.get_vector("recalls", recall_id)
                    assert vector is not None, "a recall point always has its query vector"
                    stored = self._add(recall["namespace"], recall["task"], vector, experience, outcome, None, meta)
        missing = [memory_id for memory_id in stored_ids if memory_id not in current]
        return ReportResult(recall_id=recall_id, reward=reward, updated=changes, missing=missing, stored=stored)

    def _pending_recall(self, recall_id: str) -> dict[str, Any]:
        recall = self._store.get("recalls", [recall_id]).get(recall_id) if _is_uuid(recall_id) else None
        if recall is None:
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

    def _apply_changes(self, changes: list[QChange], reward: float, now: float) -> None:
        """Set absolute values, so that redoing an interrupted report is harmless."""
        for change in changes:
            self._store.set_payload(
                "memories",
                change.id,
                {"q": change.q_after, "visits": change.visits, "last_reward": reward, "updated_at": now},
            )

    def _finish_interrupted_reports(self) -> None:
        for recall_id, recall in list(self._store.scroll("recalls", {"status": RECALL_APPLYING})):
            changes = [QChange(**c) for c in recall["changes"]]
            alive = self._store.get("memories", [c.id for c in changes])
            self._apply_changes([c for c in changes if c.id in alive], recall["reward"], recall["reported_at"])
            self._store.set_payload("recalls", recall_id, {"status": RECALL_REPORTED})

    # -- store ----------------------------------------------------------------------------------

    def store_experience(
        self,
        task: str,
        experience: str,
        namespace: str | None = None,
        outcome: Outcome = "success",
        q: float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> StoreResult:
        """Add a memory directly (seeding, imports); a near-duplicate task with the same outcome merges."""
        s = self.settings
        task = self._text("task", task, s.max_task_chars)
        experience = self._text("experience", experience, s.max_experience_chars)
        namespace = self._namespace(namespace)
        _check_outcome(outcome)
        if q is not None:
            q = _float_in("q", q, s.reward_min, s.reward_max)
        meta = self._metadata(metadata)
        vector = self._embed_task(task)
        with self._write_lock:
            twins = self._store.search(vector, 1, self.merge_threshold, {"namespace": namespace, "outcome": outcome})
            if twins:
                return self._merge(twins[0].id, twins[0].payload, experience, meta)
            return self._add(namespace, task, vector, experience, outcome, q, meta)

    def _merge(
        self, memory_id: str, payload: Mapping[str, Any], experience: str, metadata: dict[str, Any]
    ) -> StoreResult:
        """Merge rule: a memory of the same namespace and outcome whose task is at least
        ``merge_threshold`` similar is the same memory; it takes the newer experience and metadata
        and keeps its id, learned Q and visits."""
        update = {
            "experience": experience,
            "metadata": {**payload.get("metadata", {}), **metadata},
            "merges": int(payload.get("merges", 0)) + 1,
            "updated_at": self._clock(),
        }
        self._store.set_payload("memories", memory_id, update)
        return StoreResult(id=memory_id, merged=True, memory=_view(memory_id, {**payload, **update}))

    def _add(
        self,
        namespace: str,
        task: str,
        vector: np.ndarray,
        experience: str,
        outcome: Outcome,
        q: float | None,
        metadata: dict[str, Any],
    ) -> StoreResult:
        """A new memory, at Q_init for its outcome unless ``q`` is given."""
        if q is None:
            q = self.settings.q_init_success if outcome == "success" else self.settings.q_init_failure
        now = self._clock()
        memory_id = new_id()
        payload = {
            "namespace": namespace,
            "task": task,
            "experience": experience,
            "outcome": outcome,
            "q": q,
            "visits": 0,
            "last_reward": None,
            "merges": 0,
            "created_at": now,
            "updated_at": now,
            "metadata": metadata,
        }
        self._store.upsert("memories", [Point(memory_id, vector, payload)])
        return StoreResult(id=memory_id, merged=False, memory=_view(memory_id, payload))

    # -- forget, read, stats --------------------------------------------------------------------

    def forget(self, memory_id: str | None = None, namespace: str | None = None) -> ForgetResult:
        """Delete one memory by id, or every memory and recall of a namespace (exactly one of the two)."""
        if (memory_id is None) == (namespace is None):
            raise MemoryRequestError("give exactly one of memory_id (one memory) or namespace (all of it)")
        with self._write_lock:
            if memory_id is not None:
                self.get(memory_id)
                self._store.delete("memories", [memory_id])
                return ForgetResult(deleted=1)
            namespace = self._namespace(namespace)
            where = {"namespace": namespace}
            deleted = self._store.count("memories", where)
            self._store.delete_where("memories", where)
            self._store.delete_where("recalls", where)
            return ForgetResult(deleted=deleted)

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
        for start in range(0, len(memories), batch):
            chunk = memories[start : start + batch]
            vectors = self._embed_tasks([m.task for m in chunk])
            points = [Point(m.id, v, m.model_dump(exclude={"id"})) for m, v in zip(chunk, vectors, strict=True)]
            self._store.upsert("memories", points)
        return len(memories)

    def get(self, memory_id: str) -> MemoryView:
        payload = self._store.get("memories", [memory_id]).get(memory_id) if _is_uuid(memory_id) else None
        if payload is None:
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r}")
        return _view(memory_id, payload)

    def stats(self, namespace: str | None = None) -> Stats:
        where = None if namespace is None else {"namespace": self._namespace(namespace)}
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
            recalls_pending=self._store.count("recalls", {**(where or {}), "status": RECALL_PENDING}),
            recalls_reported=self._store.count("recalls", {**(where or {}), "status": RECALL_REPORTED}),
        )

    # -- validation -----------------------------------------------------------------------------

    def _namespace(self, namespace: str | None) -> str:
        namespace = self.settings.namespace if namespace is None else namespace
        if not isinstance(namespace, str) or not re.fullmatch(NAMESPACE_PATTERN, namespace):
            raise MemoryRequestError(f"namespace: {namespace!r} must be 1-64 characters of letters, digits and _ . : -")
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
