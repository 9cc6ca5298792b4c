"""Optimistic writes: why no reward is lost or counted twice, whatever races and whatever crashes.

There is no lock around the learned state (replicas of the server may share one Qdrant server). Instead:

1. **A versioned write applied once** (:meth:`Ledger.update_once`). Each memory carries a ``version`` and the
   last :data:`~memrl_mcp.memory.records.APPLIED_KEPT` operations folded into it (``applied``, as tokens:
   :func:`~memrl_mcp.memory.records.operation_token`). A write is
   conditional on the version it read (``Store.set_payload_if``, which says whether it applied); if the operation
   is in ``applied`` already it landed before (a retried or redone operation is never applied twice); if another
   writer won, it reads again and retries. A memory that is gone is reported as such, never re-created.
2. **The claim** (:meth:`Ledger.claim`). A report writes ``pending -> applying`` conditionally, with a fresh claim
   id and everything the report needs (:class:`~memrl_mcp.memory.records.ClaimedReport`); the write that applied
   (or, where the store cannot tell, the claim id read back) tells who won. Of two reports of one recall (two
   threads, two replicas) exactly one proceeds.
3. **The redo** (:meth:`Ledger.redo`). A claimed recall is its report's redo log. Its steps are each idempotent:
   update each recalled memory once (operation ``q:<recall>``), merge the experience into the twin once
   (``merge:<recall>``) or add it under an id derived from the recall (a redo finds it), then
   ``applying -> reported`` (conditional). Whoever runs it (the reporter, or the next server to open the store
   after a crash) gets the same result, so running it twice is harmless.

A namespace being forgotten deletes its recalls before its memories: a report whose recall is gone stops
before writing (:class:`RecallGoneError`), so a forgotten namespace never comes back through a report.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from memrl_mcp.embeddings import canonical_task
from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.memory import algorithm
from memrl_mcp.memory.history import QHistory
from memrl_mcp.memory.records import (
    READ,
    ClaimedReport,
    RecallRecord,
    applied_ids,
    applied_text,
    memory_payload,
    memory_view,
    merged_metadata,
    was_applied,
)
from memrl_mcp.models import ExperienceSource, MemoryView, QChange, QEvent, ReportResult, StoreResult
from memrl_mcp.settings import LearningSettings
from memrl_mcp.storage import Point, Store, Table

WRITE_ATTEMPTS = 200  # optimistic write retries before giving up on a memory (contention, not an error)


class WriteContentionError(MemrlError):
    """A memory's optimistic write lost :data:`WRITE_ATTEMPTS` races in a row; nothing of this call was written
    to it. Retrying later is safe (every operation is applied once)."""


class RecallGoneError(MemoryRequestError):
    """The recall being reported was deleted mid-report: its namespace was forgotten, or it was evicted."""

    def __init__(self, recall_id: str) -> None:
        super().__init__(
            f"recall_id: recall {recall_id} is gone (its namespace was forgotten, or it expired) while it was being "
            "reported; nothing more was written"
        )


@dataclass(frozen=True)
class Written:
    """An applied :meth:`Ledger.update_once`: the memory before, and the fields written (None: the operation
    had been applied already, by an earlier attempt or another writer)."""

    before: dict[str, Any]
    update: dict[str, Any] | None


@dataclass(frozen=True)
class Applied:
    changes: list[QChange]
    missing: list[str]
    stored: StoreResult | None


class Ledger:
    """The conditional writes of one service over its store, with the learning rule's constants (alpha, Q_init, the
    Q history's size) and the metadata limit of merges; ``conflicts`` counts lost races (a metric)."""

    def __init__(
        self, store: Store, learning: LearningSettings, max_metadata_chars: int, merge_threshold: float
    ) -> None:
        self._merge_threshold = merge_threshold
        self._store = store
        self._learning = learning
        self._max_metadata_chars = max_metadata_chars
        self.history = QHistory(store, learning.q_history_size)
        self.conflicts = 0

    def update_once(
        self,
        memory_id: str,
        operation: str,
        change: Callable[[Mapping[str, Any]], dict[str, Any]],
        table: Table = "memories",
    ) -> Written | None:
        """Apply ``change`` to a memory (or a step record) once, however many writers race; None when it is gone.
        ``change`` runs once per attempt, just before that attempt's write (the step memory checkpoints there)."""
        tried: Written | None = None  # this call's last write, when the store could not confirm it
        for attempt in range(WRITE_ATTEMPTS):
            before = self._store.get(table, [memory_id]).get(memory_id)
            if before is None:
                return None
            applied = applied_ids(before)
            if was_applied(applied, operation):
                return tried or Written(before, None)
            version = int(before.get("version", 0))
            update = {**change(before), "version": version + 1, "applied": applied_text(applied, operation)}
            if self._store.set_payload_if(table, memory_id, update, {"version": version}):
                return Written(before, update)
            tried = Written(before, update)
            self.conflicts += 1
            time.sleep(random.uniform(0, 0.0005 * min(attempt + 1, 20)))  # jitter; not the service's seeded rng
        raise WriteContentionError(
            f"memory {memory_id}: {WRITE_ATTEMPTS} concurrent writers in a row won the race; retry the call"
        )

    def claim(self, recall_id: str, report: ClaimedReport, pending: RecallRecord | None = None) -> RecallRecord:
        """``pending -> applying`` with ``report``; the claimed record, or a refusal naming why it was not ours.
        ``pending``: the record as read just before, which the claim then need not read back."""
        claimed = {"status": "applying", "report": report.model_dump()}
        won = self._store.set_payload_if("recalls", recall_id, claimed, {"status": "pending"})
        if won and pending is not None:
            return pending.model_copy(update={"status": "applying", "report": report})
        payload = self._store.get("recalls", [recall_id]).get(recall_id)
        if payload is None:
            raise RecallGoneError(recall_id)
        record = RecallRecord.model_validate(payload)
        if record.report is None or record.report.claim != report.claim:
            raise MemoryRequestError(f"recall_id: recall {recall_id} was already reported; a recall is reported once")
        return record

    def merge(
        self,
        memory_id: str,
        operation: str,
        experience: str,
        metadata: Mapping[str, Any],
        now: float,
        source: ExperienceSource,
        client: str | None = None,
    ) -> StoreResult | None:
        """Merge rule: the twin takes the newer experience (and who wrote it, and with which client) and metadata, and
        keeps its id, learned Q and visits. None when the twin was forgotten meanwhile."""
        written = self.update_once(
            memory_id,
            operation,
            lambda m: {
                "experience": experience,
                "experience_source": source,
                "client": client,
                "metadata": merged_metadata(m.get("metadata") or {}, metadata, self._max_metadata_chars),
                "merges": int(m.get("merges", 0)) + 1,
                "updated_at": now,
            },
        )
        if written is None:
            return None
        return StoreResult(
            id=memory_id, merged=True, memory=memory_view(memory_id, {**written.before, **(written.update or {})})
        )

    def keep(self, memory: MemoryView, vector: np.ndarray, operation: str) -> StoreResult:
        """The merge rule, for a new experience ``memory`` (whose id :func:`variant_id` derives) of a task embedded as
        ``vector``. Its task's variants are the memories of the same namespace and outcome whose task is at least
        ``merge_threshold`` similar. The same experience (:func:`same_text`) merges into its twin, which keeps its
        id, learned Q and visits (``operation``, once). A different procedure must not inherit what another earned:
        it is added, with its own Q; when the task has ``max_task_variants`` already, it replaces the variant of
        lowest utility (then fewest visits), so that one task's memory stays bounded. Searched at each store, so
        that what was just stored counts; concurrent stores of one experience derive one id, and make one memory."""
        where = {"namespace": memory.namespace, "outcome": memory.outcome}
        limit = self._learning.max_task_variants + 1
        twins = [hit.id for hit in self._store.search(vector, limit, self._merge_threshold, where)]
        found = self._store.get("memories", [memory.id, *twins])
        variants = [(twin, found[twin]) for twin in dict.fromkeys(twins) if twin in found and twin != memory.id]
        same = memory.id if memory.id in found else None
        same = same or next(
            (t for t, m in variants if same_text(str(m.get("experience", "")), memory.experience)), None
        )
        if same is not None:
            source = memory.experience_source or "agent"
            merged = self.merge(
                same, operation, memory.experience, memory.metadata, memory.updated_at, source, memory.client
            )
            if merged is not None:
                return merged
        if len(variants) >= self._learning.max_task_variants:
            weakest, _ = min(variants, key=lambda v: (READ["q"](v[1].get("q")), READ["visits"](v[1].get("visits"))))
            self._store.delete("memories", [weakest])
            self.history.forget([weakest])
        self._store.upsert("memories", [Point(memory.id, vector, memory_payload(memory))])
        return StoreResult(id=memory.id, merged=False, memory=memory)

    def report(self, recall_id: str, report: ClaimedReport, pending: RecallRecord | None = None) -> ReportResult:
        """Claim the recall with ``report`` and apply it: ``report_outcome``, and a trajectory's report of its
        recall (whose claim id derives from the episode, so that its redo is recognised as its own)."""
        applied = self.redo(recall_id, self.claim(recall_id, report, pending))
        return reported(recall_id, report, applied)

    def redo(self, recall_id: str, recall: RecallRecord) -> Applied:
        """Everything a claimed report does (module docstring, 3.): run by the reporter, or again after a crash."""
        report = recall.report
        assert report is not None, "only a claimed recall is redone"
        reward, now, rate = report.reward, report.reported_at, self._learning.alpha * report.weight

        def fold(memory_id: str, m: Mapping[str, Any]) -> dict[str, Any]:
            """Q <- Q + rate (R - Q), with its event in the history: one write (after a copy of a full tail)."""
            q_before = READ["q"](m.get("q"))  # as a read shows it, whoever wrote it
            q_after = algorithm.update_q(q_before, reward, rate)
            event = QEvent(
                at=now,
                event="reward",
                reward=reward,
                q_before=q_before,
                q_after=q_after,
                recall_id=recall_id,
                source=report.reward_source,
                note=report.note,
                claimed=report.claimed,
            )
            return {
                "q": q_after,
                "visits": READ["visits"](m.get("visits")) + 1,
                "last_reward": reward,
                "updated_at": now,
                **self.history.append(memory_id, m, event),
            }

        followed = recall.memory_ids if report.followed is None else report.followed
        changes, missing = self._fold_each(followed, f"q:{recall_id}", fold)
        stored = None
        if report.experience is not None:
            stored = self._store_experience(recall_id, recall, report)
        self._store.set_payload_if("recalls", recall_id, {"status": "reported"}, {"status": "applying"})
        return Applied(changes, missing, stored)

    def correct(self, recall_id: str, recall: RecallRecord, corrected: ClaimedReport) -> ReportResult:
        """Decide a reported recall's reward again (later evidence, :mod:`memrl_mcp.memory.evidence`): each memory it
        moved is moved as if ``corrected`` had been reported, whatever rewards came since: this recall's share of its
        Q (what its events in the history moved it by) is replaced by ``rate (R' - Q0)``, Q0 its Q before the recall's
        report. Once per correction (operation ``correct:<recall>:<n>``); a memory whose events of this recall left
        its history is left as it is. The recall keeps the corrected report."""
        report = recall.report
        assert report is not None and recall.status == "reported", "only a reported recall is corrected"
        operation = f"correct:{recall_id}:{corrected.corrections}"
        rate = self._learning.alpha * corrected.weight

        def fold(memory_id: str, m: Mapping[str, Any]) -> dict[str, Any]:
            mine = [e for e in self.history.events(memory_id, m) if e.get("recall_id") == recall_id]
            if not mine:
                return {}
            q_now, q_start = READ["q"](m.get("q")), float(mine[0]["q_before"])
            share = sum(float(e["q_after"]) - float(e["q_before"]) for e in mine)
            q_after = q_now - share + rate * (corrected.reward - q_start)
            event = QEvent(
                at=corrected.reported_at,
                event="correction",
                reward=corrected.reward,
                q_before=q_now,
                q_after=q_after,
                recall_id=recall_id,
                source=corrected.reward_source,
                claimed=corrected.claimed,
            )
            return {"q": q_after, "last_reward": corrected.reward, **self.history.append(memory_id, m, event)}

        followed = recall.memory_ids if report.followed is None else report.followed
        changes, missing = self._fold_each(followed, operation, fold)
        self._store.set_payload("recalls", recall_id, {"report": corrected.model_dump()})
        return reported(recall_id, corrected, Applied(changes, missing, None))

    def _fold_each(
        self, memory_ids: list[str], operation: str, fold: Callable[[str, Mapping[str, Any]], dict[str, Any]]
    ) -> tuple[list[QChange], list[str]]:
        """``fold`` each memory once (operation ``operation``); the changes of Q, and the memories gone."""
        changes, missing = [], []
        for memory_id in memory_ids:
            written = self.update_once(memory_id, operation, partial(fold, memory_id))
            if written is None:
                self.history.forget([memory_id])  # an attempt may have copied its tail before it was deleted
                missing.append(memory_id)
            elif written.update is not None and "q" in written.update:
                changes.append(
                    QChange(
                        id=memory_id,
                        q_before=READ["q"](written.before.get("q")),
                        q_after=written.update["q"],
                        visits=written.update.get("visits", READ["visits"](written.before.get("visits"))),
                    )
                )
        return changes, missing

    def _store_experience(self, recall_id: str, recall: RecallRecord, report: ClaimedReport) -> StoreResult:
        """The report's experience, under the merge rule (:meth:`keep`), as the recall's task embedded."""
        assert report.experience is not None and report.outcome is not None
        vector = self._store.get_vector("recalls", recall_id)
        if vector is None:  # the recall was deleted mid-report: its namespace is being forgotten
            raise RecallGoneError(recall_id)
        memory = MemoryView(
            id=variant_id(recall.namespace, report.outcome, recall.task, report.experience),
            namespace=recall.namespace,
            task=recall.task,
            experience=report.experience,
            outcome=report.outcome,
            q=self._learning.q_init(report.outcome),
            visits=0,
            last_reward=None,
            merges=0,
            created_at=report.reported_at,
            updated_at=report.reported_at,
            metadata=dict(report.metadata),
            experience_source=report.experience_source,
            client=report.client,
        )
        stored = self.keep(memory, vector, f"merge:{recall_id}")
        if recall_id not in self._store.get("recalls", [recall_id]):  # forgotten between the read and the add
            if not stored.merged:
                self._store.delete("memories", [memory.id])
            raise RecallGoneError(recall_id)
        return stored


def variant_id(namespace: str, outcome: str, task: str, experience: str) -> str:
    """The id of a memory of ``experience`` for ``task``: derived from what the merge rule holds the same (the
    task's canonical form, the experience with spacing and case aside), so that a redo of a report, a retried store
    and concurrent stores of one experience all find the one memory instead of adding twins."""
    words = " ".join(experience.split()).casefold()
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-variant:{namespace}:{outcome}:{canonical_task(task)}:{words}"))


def reported(recall_id: str, report: ClaimedReport, applied: Applied) -> ReportResult:
    """What a report (or a correction) answers."""
    return ReportResult(
        recall_id=recall_id,
        reward=report.reward,
        reward_source=report.reward_source,
        claimed=report.claimed,
        updated=applied.changes,
        missing=applied.missing,
        stored=applied.stored,
    )


def same_text(first: str, second: str) -> bool:
    """Whether two experiences say the same, whitespace and case aside: the same procedure, written again."""
    return " ".join(first.split()).casefold() == " ".join(second.split()).casefold()
