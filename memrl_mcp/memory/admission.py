"""What each call that grows a namespace may add to it, for its admission under the storage quota
(:class:`~memrl_mcp.storage.quota.Quotas`): computed from the texts a call stores and the records it makes, before it
writes, so that a call is admitted or refused whole."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from memrl_mcp.memory.records import RecallRecord, StepPayload, memory_payload
from memrl_mcp.models import MemoryView, StepRecordView
from memrl_mcp.storage import Store
from memrl_mcp.storage.quota import UPDATE_BYTES, new_record_bytes, payload_bytes, record_bytes, text_bytes

RESTORE_BATCH = 256  # memories or step records an import embeds and writes together


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
