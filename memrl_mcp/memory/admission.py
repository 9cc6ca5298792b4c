"""The storage quotas of the tenants' namespaces: each namespace's quota, the admission of each call that would grow
it (:class:`Quotas`), and what each call may add (:func:`report_bytes`, ...), computed from the texts a call stores
and the records it makes before it writes, so that a call is admitted or refused whole. What a namespace holds is
metered by the store (:mod:`memrl_mcp.storage.quota`).

**Who is refused.** :class:`Quotas` admits a call that grows a namespace only if the namespace's usage, plus what
the calls in flight for it may still add, plus what this call may add, fits in its quota; what a call may add is
reserved until it returns, so concurrent calls cannot overshoot together. A call is admitted or refused whole
before it writes, so no report stops halfway for want of quota. What a call may add is computed from the texts
it stores (:func:`text_bytes`) and the records it makes; the bookkeeping of updates (a Q event of ~160 bytes per
recalled memory, capped by ``q_history_size``) is counted at :data:`UPDATE_BYTES` each, and an edit counts the
version it replaces. What a call adds may exceed the estimate by up to ~2 KB (a merge keeps the union of the old
and new metadata, up to ``max_metadata_chars``), and a report by the versions of the memories it updates, which
the next admission at the quota gives back: a namespace ends within that of its quota.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.records import RecallRecord, StepPayload, memory_payload
from memrl_mcp.models import MemoryView, StepRecordView
from memrl_mcp.settings import ALL_NAMESPACES, TokenGrant
from memrl_mcp.storage import Store
from memrl_mcp.storage.disk import MB
from memrl_mcp.storage.quota import (
    GIVE_BACK_EVERY,
    UPDATE_BYTES,
    new_record_bytes,
    payload_bytes,
    record_bytes,
    text_bytes,
)

RESTORE_BATCH = 256  # memories or step records an import embeds and writes together


class QuotaExceededError(MemoryRequestError):
    """A call would take a namespace past its storage quota; nothing was written."""


class Quotas:
    """Each namespace's quota (``namespace_quota_mb``, or the largest ``namespace_quota_mb`` of the tokens that
    name it), and the admission of the calls that grow it (module docstring)."""

    def __init__(self, store: Store, default_mb: int, grants: Sequence[TokenGrant]) -> None:
        self._store = store
        self._default = default_mb
        self._by_namespace: dict[str, int] = {}
        for grant in grants:
            if grant.namespace_quota_mb is not None:
                for namespace in grant.namespaces:
                    if namespace != ALL_NAMESPACES:
                        self._by_namespace[namespace] = max(
                            grant.namespace_quota_mb, self._by_namespace.get(namespace, 0)
                        )
        self._reserved: Counter[str] = Counter()
        self._lock = threading.Lock()

    def of(self, namespace: str) -> int:
        """The namespace's quota in MB (0: none)."""
        return self._by_namespace.get(namespace, self._default)

    @contextmanager
    def admit(self, namespace: str, need: int) -> Iterator[None]:
        """Run the block only if ``need`` more bytes fit in the namespace's quota; hold them meanwhile."""
        with self._lock:
            self._check(namespace, need)
            self._reserved[namespace] += need
        try:
            yield
        finally:
            with self._lock:
                self._reserved[namespace] -= need

    @contextmanager
    def admit_all(self, added: Mapping[str, int]) -> Iterator[None]:
        """Admission of a write that adds to several namespaces at once: all of them, or none."""
        with ExitStack() as stack:
            for namespace, size in sorted(added.items()):
                stack.enter_context(self.admit(namespace, size))
            yield

    def check(self, namespace: str, need: int) -> None:
        """Refuse unless ``need`` more bytes fit in the namespace's quota now (an import, before it writes)."""
        with self._lock:
            self._check(namespace, need)

    def _check(self, namespace: str, need: int) -> None:
        quota = self.of(namespace) * MB
        used = self._store.usage(namespace) if quota else None
        if used is None or used + self._reserved[namespace] + need <= quota:
            return
        held = self._store.reclaim(namespace)
        used = self._store.usage(namespace) or 0
        if used + self._reserved[namespace] + need > quota:
            rewrites = (
                f" ({held / MB:.2f} MB of it versions that rewrites replaced, whose room the store reuses within "
                f"{GIVE_BACK_EVERY:.0f} s: a retry then may fit)"
                if held
                else ""
            )
            raise QuotaExceededError(
                f"namespace: {namespace!r} is at its storage quota: {used / MB:.2f} MB stored of {quota // MB} MB "
                f"(namespace_quota_mb){rewrites}, and this would add up to {need / 1024:.1f} KB more. Forget what is "
                "no longer needed to make room (forget_experience: a memory_id, or the namespace to drop all of it; "
                "forgotten records stop counting at once), or ask the operator for a larger namespace_quota_mb"
            )


def report_bytes(recall: RecallRecord, experience: str | None, metadata: Mapping[str, Any], dim: int) -> int:
    """What reporting ``recall`` may add: the report in the recall's record, a Q update per recalled memory, and
    the new memory of ``experience``."""
    added = new_record_bytes(experience, metadata, dims=0) + UPDATE_BYTES * len(recall.memory_ids)
    if experience is not None:
        added += new_record_bytes(recall.task, experience, metadata, dims=dim)
    return added


def edit_bytes(memory: Mapping[str, Any], experience: str | None, metadata: Mapping[str, Any] | None) -> int:
    """What editing ``memory`` (its payload as read) may add: the texts written, a Q event, and the version the
    edit replaces, which the engine keeps until its next flush (:mod:`memrl_mcp.storage.quota`)."""
    return payload_bytes(memory) + text_bytes(experience, metadata) + UPDATE_BYTES


def trajectory_bytes(task: str, steps: Sequence[tuple[str, str, float]], dim: int) -> int:
    """What a reported trajectory may add: its episode record (the task and every step) and a record per step."""
    episode = new_record_bytes(task, [[observation, action] for observation, action, _ in steps], dims=1)
    return episode + sum(new_record_bytes(task, observation, action, dims=2 * dim) for observation, action, _ in steps)


def restore_bytes(store: Store, records: Sequence[MemoryView | StepRecordView], dim: int) -> Counter[str]:
    """Per namespace, what restoring ``records`` adds: the size of those whose id is not stored yet (a resumed
    import replaces the others with the same)."""
    added: Counter[str] = Counter()
    for start in range(0, len(records), RESTORE_BATCH):
        chunk = records[start : start + RESTORE_BATCH]
        for table, kind in (("memories", MemoryView), ("steps", StepRecordView)):
            mine = [record for record in chunk if isinstance(record, kind)]
            stored = store.get(table, [record.id for record in mine], ())  # type: ignore[arg-type]
            for record in mine:
                if record.id not in stored:
                    added[record.namespace] += _record_bytes(record, dim)
    return added


def _record_bytes(record: MemoryView | StepRecordView, dim: int) -> int:
    if isinstance(record, MemoryView):
        return record_bytes(memory_payload(record), dim)
    step = StepPayload(**record.model_dump(exclude={"id"}))
    return record_bytes(step.model_dump(), 2 * dim)
