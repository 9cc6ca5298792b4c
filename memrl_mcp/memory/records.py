"""What the tables hold, typed: a memory's payload, a recall's record, a step record and an episode record; the ids
derived from their keys; and what a record given from outside (an import) must satisfy to be written.

A recall record is written by ``recall``, claimed by ``report`` and finished by the redo of
:mod:`memrl_mcp.memory.ledger`; every one of its keys is declared here, once."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

from memrl_mcp.embeddings import canonical_task
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.models import (
    ActionView,
    ExperienceSource,
    MemoryDetail,
    MemoryView,
    QEvent,
    RewardSource,
    StepRecordView,
)
from memrl_mcp.storage.numbers import finite
from memrl_mcp.validation import (
    COUNT,
    FINITE,
    MAX_SAFE_INTEGER,
    MAX_TIMESTAMP,
    NAMESPACE,
    OUTCOMES,
    POINT_ID,
    TIMESTAMP,
    Check,
    Limits,
    Outcome,
    check_outcome,
    client_name,
)

log = logging.getLogger(__name__)

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
    reward_source: RewardSource = "agent"
    experience_source: ExperienceSource = "agent"
    note: str | None = Field(None, description="The user's note, when the user gave the reward.")
    weight: float = Field(1.0, description="The share of alpha the update moves by (model_reward_weight).")
    claimed: float | None = Field(None, description="The agent's reward, when the evidence or the user overruled it.")
    followed: list[str] | None = Field(None, description="The memories the agent followed: the ones that move.")
    corrections: int = Field(0, description="Rewards decided again by later evidence (correction_window_seconds).")
    client: str | None = Field(None, description="The MCP client whose session reported (the experience's writer).")


class RecallRecord(BaseModel):
    """A recall as stored; the point's vector is the query embedding, reused to store the reported experience."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    task: str
    memory_ids: list[str] = Field(description="The memories the recall returned: the ones its report updates.")
    status: RecallStatus
    created_at: float
    expires_at: float
    report: ClaimedReport | None = None
    evidence: list[Check] = Field(default_factory=list, description="What happened in the task (record_evidence).")
    revision: int = Field(0, description="Counts the writes of the evidence: each is conditional on the one it read.")

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, payload: Any) -> Any:
        """Stores written before the report had its own record kept the claim's fields beside the others; before the
        merge rule searched at each store, the twin a recall saw."""
        if isinstance(payload, dict) and "twins" in payload:
            payload = {key: value for key, value in payload.items() if key != "twins"}
        if isinstance(payload, dict) and "claim" in payload:
            payload = dict(payload)
            flat = {key: payload.pop(key, None) for key in ("claim", "reward", "reported_at", "experience", "outcome")}
            payload["report"] = {**flat, "metadata": payload.pop("report_metadata", None) or {}}
        return payload

    def payload(self) -> dict[str, Any]:
        return self.model_dump()


def memory_payload(memory: MemoryView) -> dict[str, Any]:
    """A memory as stored: its fields, plus the version and applied operations of optimistic writes."""
    return {**memory.model_dump(exclude={"id"}), "version": 0, "applied": ""}


APPLIED_KEPT = 64  # operations a record remembers having applied: more than any retry can race past


def operation_token(operation: str) -> str:
    """An operation as ``applied`` keeps it: 12 characters of its SHA-256 (72 bits), a quarter to a third of the
    id's length, so that the 64 a memory keeps, read and rewritten at every update, take a third of the bytes (schema
    version 5). Mistaking a new operation for one of the 64 kept has a chance of 64 / 2^72 (1e-20) per update."""
    return base64.urlsafe_b64encode(hashlib.sha256(operation.encode()).digest()[:9]).decode()


def applied_ids(payload: Mapping[str, Any]) -> list[str]:
    """The operations last applied to a memory or a step record (:mod:`memrl_mcp.memory.ledger`), oldest first:
    their tokens (:func:`operation_token`), or their ids as records written before version 5 keep them."""
    applied = payload.get("applied") or []
    return applied.split() if isinstance(applied, str) else list(applied)


def was_applied(applied: list[str], operation: str) -> bool:
    """Whether ``applied`` (:func:`applied_ids`) holds ``operation``, as a token or as an id kept before."""
    return operation_token(operation) in applied or operation in applied


def applied_text(applied: list[str], operation: str) -> str:
    """The last :data:`APPLIED_KEPT` operations with ``operation`` as stored: in one text, space-separated (schema
    version 4). The engine's binding converts a list item by item, so one text is built much faster
    (docs/performance.md). A record written before version 4 holds a list, which is still
    read."""
    return " ".join([*applied, operation_token(operation)][-APPLIED_KEPT:])


OPTIONAL_FIELDS: dict[str, Any] = {
    "merges": 0,
    "metadata": {},
    "last_reward": None,
    "client": None,
    "recalled_at": None,
}
"""Fields a stored memory may lack: written by later versions, or a null the engine does not keep."""


def memory_view(memory_id: str, payload: Mapping[str, Any]) -> MemoryView:
    """A stored memory as the tools show it (read leniently: :func:`readable`)."""
    fields = {**OPTIONAL_FIELDS, **payload, "id": memory_id}
    try:
        view = MemoryView.model_validate(fields)
        if _usable(view):
            return view
    except ValidationError:
        pass
    return MemoryView.model_validate(readable(memory_id, fields))


def memory_detail(memory_id: str, payload: Mapping[str, Any], history: list[dict[str, Any]]) -> MemoryDetail:
    """A memory with its Q history (:meth:`memrl_mcp.memory.history.QHistory.events`), read leniently: an event no
    read can use is left out (:func:`readable`)."""
    fields = {**OPTIONAL_FIELDS, **payload, "history": history, "id": memory_id}
    try:
        detail = MemoryDetail.model_validate(fields)
        if _usable(detail) and all(_usable_event(event) for event in detail.history):
            return detail
    except ValidationError:
        pass
    events = [event for event in map(_event, history) if event is not None]
    dropped = ["history"] if len(events) < len(history) else []
    return MemoryDetail.model_validate({**readable(memory_id, fields, dropped), "history": events})


def readable(memory_id: str, fields: Mapping[str, Any], also: list[str] | None = None) -> dict[str, Any]:
    """A stored memory's fields with each value a read cannot use replaced by the field's neutral value (:data:`READ`),
    so that one damaged record (another replica's or version's values, a hand edit, an import of a version that let
    a time past 9999 in) never fails the reads of its namespace: it is shown, and can be corrected or forgotten. The
    log names the fields (and ``also``, what the caller left out)."""
    repaired = {name: rule(fields.get(name)) for name, rule in READ.items()}
    changed = sorted(name for name, value in repaired.items() if not _same(value, fields.get(name))) + (also or [])
    log.warning("memory %s holds values no read can use (%s): shown with neutral values", memory_id, ", ".join(changed))
    return {**fields, **repaired}


def _usable(view: MemoryView) -> bool:
    """The fast path's check: what validation lets through that a read still cannot use (NaN, an infinity, a time
    no date shows)."""
    last = view.last_reward
    return (
        math.isfinite(view.q)
        and (last is None or math.isfinite(last))
        and 0.0 <= view.created_at <= MAX_TIMESTAMP
        and 0.0 <= view.updated_at <= MAX_TIMESTAMP
        and (view.recalled_at is None or 0.0 <= view.recalled_at <= MAX_TIMESTAMP)
    )


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _usable_event(event: QEvent) -> bool:
    return all(math.isfinite(x) for x in (event.q_before, event.q_after, event.reward or 0.0))


def _event(event: Any) -> QEvent | None:
    try:
        parsed = QEvent.model_validate(event)
    except ValidationError:
        return None
    return parsed if _usable_event(parsed) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)


def _time(value: Any) -> float:
    number = finite(value)
    return 0.0 if number is None else min(max(number, 0.0), MAX_TIMESTAMP)


def _count(value: Any) -> int:
    number = finite(value)
    return 0 if number is None else int(min(max(number, 0.0), MAX_SAFE_INTEGER))


def _json_object(value: Any) -> dict[str, Any]:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) and all(isinstance(key, str) for key in value) else {}


READ: dict[str, Callable[[Any], Any]] = {
    "namespace": _text,
    "task": _text,
    "experience": _text,
    "outcome": lambda value: value if value in OUTCOMES else "failure",
    "q": lambda value: finite(value) or 0.0,
    "last_reward": finite,
    "visits": _count,
    "merges": _count,
    "created_at": _time,
    "updated_at": _time,
    "metadata": _json_object,
    "experience_source": lambda value: value if value in get_args(ExperienceSource) else None,
    "client": lambda value: value if isinstance(value, str) and client_name(value) == value else None,
    "recalled_at": lambda value: None if value is None else _time(value),
}
"""Each field of a stored memory as a read can use it: a time within what a date shows, a finite Q (else 0, the
neutral utility) and last reward (else none), a count from 0 to 2^53, text (else the value's JSON), a JSON object of
finite numbers (else empty), a known outcome (else failure: a memory to be wary of rather than one to follow) and
writer and client (else unknown)."""


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
    nearest: float | None = Field(
        None, description="Similarity to the nearest other record of the namespace when last looked up (None: none)."
    )
    nearest_id: str | None = Field(None, description="That record's id.")
    nearest_weight: float | None = Field(
        None,
        description="The observation weight of that similarity (None: never looked up: a record imported, or "
        "stored before version 3).",
    )

    @field_validator("applied", mode="before")
    @classmethod
    def _applied(cls, applied: Any) -> Any:
        """Stored as text since schema version 4 (:func:`applied_text`)."""
        return applied.split() if isinstance(applied, str) else applied

    def view(self, record_id: str) -> StepRecordView:
        return StepRecordView(id=record_id, **self.model_dump(exclude=BOOKKEEPING))


BOOKKEEPING = {"version", "applied", "nearest", "nearest_id", "nearest_weight"}
"""Fields of a step record that are the store's bookkeeping, not what it learned: left out of views and exports."""


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
    proof that the episode was applied (its task and steps dropped, its result kept) so that a second report is
    told so.

    Written twice: whole at the claim, and with its task and steps dropped once reported. Its progress in between has a
    point of its own (:class:`EpisodeProgress`): qdrant-edge writes a point's whole payload anew at every change and
    frees the old copy only at a flush, so a checkpoint written here after each step would cost the trajectory's size
    per step."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    episode_id: str
    task: str
    claim: str
    status: EpisodeStatus
    reported_at: float
    recall_id: str | None
    steps: list[ReportedStep]
    reward_source: RewardSource = "agent"
    note: str | None = None
    done: int = Field(
        0,
        description="Steps applied: 0 while applying (the progress point counts them; a report claimed before "
        "schema version 3 counted them here, and is resumed from here), all of them once reported.",
    )
    result: dict[str, Any] | None = None

    @field_validator("steps", mode="before")
    @classmethod
    def _from_stored(cls, steps: Any) -> Any:
        """Stored as compressed text (:meth:`_stored`); a store older than version 3 kept a list, still read."""
        return json.loads(zlib.decompress(base64.b64decode(steps))) if isinstance(steps, str) else steps

    @field_serializer("steps")
    def _stored(self, steps: list[ReportedStep]) -> str:
        """The steps as stored: their JSON, zlib-compressed, in base64. The trajectory is written once (and again in
        the write-ahead log) and read back once. Stored as a list, it was a large share of what a report cost on disk
        (tests/test_step_costs.py); compressed, it takes a fraction of its JSON, for a few milliseconds to write and
        read (docs/performance.md, "The step memory")."""
        text = json.dumps([step.model_dump() for step in steps], ensure_ascii=False)
        return base64.b64encode(zlib.compress(text.encode())).decode()


StepOutcome = Literal["created", "merged", "added", "dropped"]
"""What applying a step did: it made its record, folded into an action tried there before, added an action to its
record, or was not stored (the memory was full and the step's record was the most redundant)."""


class EpisodeProgress(BaseModel):
    """How far the redo of a claimed episode got, and what its steps did so far: the result counts every step once,
    whichever run applied it. Its id derives from the claim; it is deleted once the episode is reported.

    ``pending`` is written before each attempt to write step ``done``'s record, in the same checkpoint, so that a
    redo finding that write landed (its operation id in the record) knows what it did without the record as it was
    before: the result then counts the step as its own run would have."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    status: Literal["progress"] = "progress"
    claim: str
    episode: str = Field(description="The id of the episode record.")
    reported_at: float
    operations: str = Field(
        description="Its steps' operation ids (the step records' once-only keys) are this and the step's index. "
        "From the claim: a later report of the same episode id, once its record was forgotten (evicted beyond "
        "max_reported_episodes), is a new episode."
    )
    done: int = 0
    created: int = 0
    merged: int = 0
    dropped: int = 0
    pending: StepOutcome | None = None

    def after(self, outcome: StepOutcome) -> EpisodeProgress:
        """Past step ``done``, which did ``outcome``."""
        counts = {key: getattr(self, key) + (outcome == key) for key in ("created", "merged", "dropped")}
        return self.model_copy(update={"done": self.done + 1, "pending": None, **counts})


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


def progress_key(claim: str) -> str:
    """The progress point of a claimed episode: derived from the claim, so a later claim of the same episode id
    (after its namespace was forgotten) never meets an older claim's progress."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-episode-progress:{claim}"))


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
    if memory.recalled_at is not None:
        TIMESTAMP.check("recalled_at", memory.recalled_at)
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
