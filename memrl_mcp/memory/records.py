"""What the tables hold, typed: a memory's payload, a recall's record, a step record and an episode record; the ids
derived from their keys; and what a record given from outside (an import) must satisfy to be written.

A recall record is written by ``recall``, claimed by ``report`` and finished by the redo of
:mod:`memrl_mcp.memory.ledger`; every one of its keys is declared here, once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memrl_mcp.embeddings import canonical_task
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.models import ActionView, MemoryDetail, MemoryView, Outcome, QEvent, StepRecordView
from memrl_mcp.validation import COUNT, FINITE, NAMESPACE, POINT_ID, TIMESTAMP, Limits, check_outcome

RecallStatus = Literal["pending", "applying", "reported"]
"""pending: issued, reportable; applying: claimed by a report, which may have been interrupted (the record is its
redo log); reported: done, kept until it expires so that a second report is told so."""


class ClaimedReport(BaseModel):
    """What a report asked for, written into the recall by the claim: enough to redo the report after a crash."""

    model_config = ConfigDict(extra="forbid")

    claim: str = Field(description="Unique per report attempt: of two racing reports, the one read back won.")
    reward: float
    reported_at: float
    experience: str | None
    outcome: Outcome | None
    metadata: dict[str, Any]


class RecallRecord(BaseModel):
    """A recall as stored; the point's vector is the query embedding, reused to store the reported experience."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    task: str
    memory_ids: list[str] = Field(description="The memories the recall returned: the ones its report updates.")
    twins: dict[Outcome, str] = Field(
        description="Per outcome, the memory this task's experience merges into (Phase A already searched around "
        "this very vector, so the report need not search again)."
    )
    status: RecallStatus
    created_at: float
    expires_at: float
    report: ClaimedReport | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, payload: Any) -> Any:
        """Stores written before the report had its own record kept the claim's fields beside the others."""
        if isinstance(payload, dict) and "claim" in payload:
            payload = dict(payload)
            flat = {key: payload.pop(key, None) for key in ("claim", "reward", "reported_at", "experience", "outcome")}
            payload["report"] = {**flat, "metadata": payload.pop("report_metadata", None) or {}}
        return payload

    def payload(self) -> dict[str, Any]:
        return self.model_dump()


def memory_payload(memory: MemoryView) -> dict[str, Any]:
    """A memory as stored: its fields, plus the version and applied operations of optimistic writes."""
    return {**memory.model_dump(exclude={"id"}), "version": 0, "applied": []}


OPTIONAL_FIELDS: dict[str, Any] = {"merges": 0, "metadata": {}, "history": [], "last_reward": None}
"""Fields a stored memory may lack: written by later versions, or a null the engine does not keep."""


def memory_view(memory_id: str, payload: Mapping[str, Any]) -> MemoryView:
    return MemoryView.model_validate({**OPTIONAL_FIELDS, **payload, "id": memory_id})


def memory_detail(memory_id: str, payload: Mapping[str, Any]) -> MemoryDetail:
    return MemoryDetail.model_validate({**OPTIONAL_FIELDS, **payload, "history": history_of(payload), "id": memory_id})


def history_of(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A memory's Q history, oldest first. It is stored as JSON text (schema version 2): qdrant-edge's Python binding
    converts a nested payload value by value, and a Q update's write with a history of 50 events took 2.0 ms as a
    list, 0.19 ms as text with its encoding (perf/history_cost.py). Stores older than version 2 held a list,
    which is still read."""
    history = payload.get("history") or []
    return json.loads(history) if isinstance(history, str) else list(history)


def with_event(payload: Mapping[str, Any], event: QEvent, capacity: int) -> str:
    """The memory's Q history with ``event`` appended, the oldest dropped beyond ``capacity`` events, as stored. It
    is written in the same conditional write as the Q it records, so neither exists without the other."""
    history = [*history_of(payload), event.model_dump()]
    return json.dumps(history[-capacity:] if capacity else [])


def merged_metadata(old: Mapping[str, Any], new: Mapping[str, Any], max_chars: int) -> dict[str, Any]:
    """A twin's metadata after a merge: its keys updated with the new ones, or the new metadata alone when the
    union would exceed the size limit (repeated merges must not grow a memory without bound)."""
    union = {**old, **new}
    return union if len(json.dumps(union, ensure_ascii=False)) <= max_chars else dict(new)


# -- the step memory ----------------------------------------------------------------------------------


class StepPayload(BaseModel):
    """A step record as stored (its point's vector: the task's and the observation's embeddings side by side)."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    task: str
    observation: str
    actions: list[ActionView]
    created_at: float
    updated_at: float
    version: int = 0
    applied: list[str] = Field(default_factory=list)

    def view(self, record_id: str) -> StepRecordView:
        return StepRecordView(id=record_id, **self.model_dump(exclude={"version", "applied"}))


class ReportedStep(BaseModel):
    """A step of a claimed trajectory with the target computed when it was claimed (so a redo applies the same)."""

    model_config = ConfigDict(extra="forbid")

    observation: str
    action: str
    reward: float
    target: float


EpisodeStatus = Literal["applying", "reported"]


class EpisodeRecord(BaseModel):
    """A reported trajectory, keyed by (namespace, episode_id): its claim and redo log while ``applying``, then the
    proof that the episode was applied (its steps dropped, its result kept) so that a second report is told so."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    episode_id: str
    task: str
    claim: str
    status: EpisodeStatus
    reported_at: float
    recall_id: str | None
    steps: list[ReportedStep]
    done: int = Field(
        0,
        description="Steps applied so far (a redo resumes here; the step's own once-only check "
        "covers the one in flight).",
    )
    result: dict[str, Any] | None = None


def canonical_text(text: str) -> str:
    """Observations and actions: whitespace folded (a re-wrapped observation is the same observation)."""
    return " ".join(text.split()) or text


def step_id(namespace: str, task: str, observation: str) -> str:
    """The record of (namespace, task, observation): derived, so identical steps always meet."""
    key = json.dumps([namespace, canonical_task(task), canonical_text(observation)], ensure_ascii=False)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-step:{key}"))


def episode_key(namespace: str, episode_id: str) -> str:
    """The episode record of (namespace, episode_id): one per namespace, so tenants never collide."""
    key = json.dumps([namespace, episode_id], ensure_ascii=False)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-episode:{key}"))


# -- records from outside (memrl-mcp import) -----------------------------------------------------------


def check_memory(limits: Limits, memory: MemoryView) -> None:
    """Refuse a memory to restore that the tools could not have stored; the message names the field."""
    POINT_ID.check("id", memory.id)
    NAMESPACE.check("namespace", memory.namespace)
    limits.task.check("task", memory.task)
    limits.experience.check("experience", memory.experience)
    check_outcome(memory.outcome)
    limits.reward.check("q", memory.q)
    if memory.last_reward is not None:
        limits.reward.check("last_reward", memory.last_reward)
    COUNT.check("visits", memory.visits)
    COUNT.check("merges", memory.merges)
    TIMESTAMP.check("created_at", memory.created_at)
    TIMESTAMP.check("updated_at", memory.updated_at)
    limits.metadata.check("metadata", memory.metadata)


def check_step(limits: Limits, max_actions: int, record: StepRecordView) -> None:
    """Refuse a step record to restore that reports could not have made; the message names the field."""
    POINT_ID.check("id", record.id)
    NAMESPACE.check("namespace", record.namespace)
    limits.task.check("task", record.task)
    limits.observation.check("observation", record.observation)
    if record.id != step_id(record.namespace, record.task, record.observation):
        raise MemoryRequestError("id: is not the id of its (namespace, task, observation); reports would miss it")
    if len(record.actions) > max_actions:
        raise MemoryRequestError(f"actions: {len(record.actions)} exceed step_max_actions={max_actions}")
    if len({a.action for a in record.actions}) < len(record.actions):
        raise MemoryRequestError("actions: an action is listed twice (each action of a record is listed once)")
    for i, action in enumerate(record.actions):
        limits.action.check(f"actions[{i}].action", action.action)
        FINITE.check(f"actions[{i}].q", action.q)
        COUNT.check(f"actions[{i}].visits", action.visits)
        limits.reward.check(f"actions[{i}].reward", action.reward)
    TIMESTAMP.check("created_at", record.created_at)
    TIMESTAMP.check("updated_at", record.updated_at)
