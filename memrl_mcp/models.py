"""What the tools take and return: typed, so that every tool answers with structured content of a known shape
(docs/tools.md lists them, generated from these models)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from memrl_mcp.requests import RecallQuery
from memrl_mcp.storage.numbers import KeptFloat, KeptJson
from memrl_mcp.storage.tally import Q_STEP, Counts
from memrl_mcp.validation import CLIENT_NAME_PATTERN, MAX_TIMESTAMP, Check, Outcome

Q_DIGITS = 6  # a tally's Q is exact to Q_STEP (1e-4); two more digits keep the quartiles' interpolation


def iso_time(seconds: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the microsecond: ``2026-11-26T01:02:03.123456Z``. A time outside what a store
    accepts (1970 to the end of 9999; an import of an older version let some in) shows as the nearest end of that
    range, not a number as 1970: one stored value must not fail a read."""
    shown = min(max(seconds, 0.0), MAX_TIMESTAMP) if seconds == seconds else 0.0
    return datetime.fromtimestamp(shown, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


Timestamp = Annotated[
    KeptFloat, PlainSerializer(iso_time, return_type=str, when_used="json"), Field(description="UTC, ISO 8601.")
]
"""A time: a Unix time (a float) in Python and in the stores, which sort and filter by it; ISO 8601 in JSON, what a
tool or a resource answers (an agent or an operator reads a date, not 1795656671.38). Backups keep the float
(``model_dump()``), so that a restore brings it back bit for bit."""


RewardSource = Literal["agent", "user", "tests", "build", "typecheck", "lint", "check"]
"""Who decided a reward (:mod:`memrl_mcp.memory.evidence`): the agent (the model's own judgement, the reward argument
of its report), the user (asked through the client, or their next words), or the kind of check whose runs decided
it (a test run, a build, a type check, a lint, a project's own check)."""
ExperienceSource = Literal["agent", "client_model", "endpoint", "operator"]
"""Who wrote an experience: the agent, the client's own model from the episode's trajectory (MCP sampling), the
server's configured OpenAI-compatible endpoint from it, or an operator's correction in the inspector."""


@dataclass(frozen=True)
class Provenance:
    """Where a report's reward and experience came from, kept with them (the Q history, the memory)."""

    reward: RewardSource = "agent"
    experience: ExperienceSource = "agent"
    note: str | None = None


AGENT = Provenance()
"""A report whose reward and experience the agent gave."""


class MemoryView(BaseModel):
    """One stored memory: the task it is keyed by, the experience to reuse, and its learned utility."""

    id: str
    namespace: str
    task: str
    experience: str
    outcome: Outcome
    q: KeptFloat = Field(description="Learned utility: a running estimate of the reward when this memory is used.")
    visits: int = Field(description="Rewards folded into q.")
    last_reward: KeptFloat | None
    merges: int = Field(description="Near-duplicate stores folded into this memory.")
    created_at: Timestamp
    updated_at: Timestamp
    metadata: KeptJson
    experience_source: ExperienceSource | None = Field(
        None, description="Who wrote the experience (None: stored before this was recorded)."
    )
    client: str | None = Field(
        None,
        pattern=CLIENT_NAME_PATTERN,
        description="The MCP client whose session wrote the experience (its clientInfo.name: claude-code; None: "
        "unknown, or stored before this was recorded).",
    )
    recalled_at: Timestamp | None = Field(
        None, description="When a recall last gave it (None: never, or not since this was recorded)."
    )


class QEvent(BaseModel):
    """One change of a memory's Q: a reward folded in by a report, or a reset by update_memory."""

    at: Timestamp
    event: Literal["reward", "reset", "correction"]
    reward: KeptFloat | None = Field(description="The reward folded in (None for a reset).")
    q_before: KeptFloat
    q_after: KeptFloat
    recall_id: str | None = Field(description="The recall whose report brought the reward (None for a reset).")
    source: RewardSource | None = Field(
        None, description="Who gave the reward (None for a reset, or a reward from before this was recorded)."
    )
    note: str | None = Field(None, description="What the user added when asked how the task went.")
    claimed: KeptFloat | None = Field(
        None, description="The model's reward, when the evidence or the user decided another outcome."
    )


class MemoryDetail(MemoryView):
    """A memory with the history of its Q, oldest first (the last ``q_history_size`` changes)."""

    history: list[QEvent]


class MemoryPage(BaseModel):
    """One page of list_memories; pass ``next_cursor`` back (same sort) for the next page."""

    namespace: str
    total: int = Field(description="Memories matching the filters, on every page.")
    memories: list[MemoryView]
    next_cursor: str | None = Field(description="None on the last page.")


class RecalledMemory(MemoryView):
    """A memory chosen for the agent, with the two numbers that chose it."""

    similarity: float = Field(description="Cosine similarity of its task to the query task (Phase A).")
    score: float = Field(description="Phase-B score (1 - lambda) z(sim) + lambda z(Q), less its fade.")
    age_days: float = Field(0.0, description="Days since it was stored (created_at), at the recall.")
    shortened: bool = Field(
        False,
        description="Its task or experience is shown shortened (max_recall_chars); the whole memory: memrl://memories/{id}.",
    )


class SearchResult(BaseModel):
    """The memories Phase A and B chose, without a recall to report (nothing is logged, no Q will move)."""

    namespace: str
    candidates: int = Field(description="Size of the Phase-A pool the memories were chosen from.")
    explored: bool = Field(description="True when epsilon-greedy exploration picked the memories.")
    memories: list[RecalledMemory]


class PoolCandidate(MemoryView):
    """A memory of Phase A's pool with every number Phase B chose by."""

    similarity: float = Field(description="Cosine similarity of its task to the query task (Phase A).")
    z_similarity: float
    z_q: float
    fade: float = Field(0.0, description="What fade_after_days took off its score (unused that long).")
    score: float = Field(description="(1 - lambda) z_similarity + lambda z_q - fade.")
    chosen: bool = Field(description="Among the k2 a recall returns (without exploration).")


class RecallPool(BaseModel):
    """Phase A's whole pool in Phase A's order (most similar first), scored, with the choice a recall would make
    without exploring: a recall explained, without a recall (nothing logged, no Q moves)."""

    query: RecallQuery = Field(description="The query with the server's settings filled in.")
    namespace: str
    candidates: list[PoolCandidate]


class RecallResult(SearchResult):
    """The memories to give the agent; report the episode's reward with ``recall_id``."""

    recall_id: str = Field(description="Report the episode's outcome with it (report_outcome), once.")


class RecallState(BaseModel):
    """Where one recall stands: whether it still waits for its report (the resource ``memrl://recalls/{id}``)."""

    recall_id: str
    namespace: str
    task: str
    status: Literal["pending", "applying", "reported", "expired"] = Field(
        description="pending: waits for its report; applying: a report is being applied; reported: done; expired: "
        "past recall_ttl_seconds unreported, it can no longer be reported."
    )
    memories: int = Field(description="How many memories the recall returned (0: nothing similar was found).")
    created_at: Timestamp
    expires_at: Timestamp
    reward: KeptFloat | None = Field(None, description="The reward reported, once reported.")
    reward_source: RewardSource | None = Field(None, description="What decided the reward, once reported.")
    evidence: list[Check] = Field(description="The checks recorded for the recall's task, in order (record_evidence).")
    evidence_says: Outcome | None = Field(
        None, description="What the evidence says of the task (None: nothing clear): it decides the reward."
    )
    evidence_source: RewardSource | None = Field(None, description="Which source said it: the user, or a check.")


class QChange(BaseModel):
    """One recalled memory's utility, moved by a report."""

    id: str
    q_before: KeptFloat
    q_after: KeptFloat
    visits: int


class StoreResult(BaseModel):
    """Where an experience went: a new memory, or merged into a near-duplicate one."""

    id: str
    merged: bool = Field(description="True when folded into an existing near-duplicate memory.")
    memory: MemoryView


class ReportResult(BaseModel):
    """What a report changed: the utility of each recalled memory, and where the new experience went."""

    recall_id: str
    reported: bool = Field(
        True, description="False: the user declined to say how the task went; nothing changed, report it again."
    )
    reward: KeptFloat | None = Field(description="The reward applied (None when nothing was reported).")
    reward_source: RewardSource | None = Field(
        None,
        description="What decided the reward: the agent's own word, the user, or a kind of check (tests, build...).",
    )
    claimed: KeptFloat | None = Field(
        None, description="The reward the agent gave, when the evidence or the user decided another outcome."
    )
    updated: list[QChange] = Field(description="Every memory the recall returned, with its Q before and after.")
    missing: list[str] = Field(description="Memories of the recall that were forgotten since; nothing to update.")
    stored: StoreResult | None = Field(description="The episode's new experience, when one was given.")
    message: str | None = Field(None, description="What the user answered, when asked; why nothing changed.")


class EvidenceResult(BaseModel):
    """What a recall's evidence says now, and the report it made or corrected."""

    recall_id: str
    checks: int = Field(description="Checks the recall holds now (the newest, up to its bound).")
    evidence_says: Outcome | None = Field(None, description="What the evidence says of the task (None: nothing clear).")
    evidence_source: RewardSource | None = Field(None, description="Which source said it.")
    report: ReportResult | None = Field(
        None, description="The report this call made (close) or corrected (a reported recall's later evidence)."
    )
    message: str


class ForgetResult(BaseModel):
    """What was deleted."""

    deleted: int
    steps_deleted: int = Field(0, description="Step records deleted with the namespace.")


def as_q(steps: float) -> float:
    """A count of :data:`Q_STEP` as a Q, to the digits the tally holds: 0.2, not 0.20000000000000001."""
    return round(steps * Q_STEP, Q_DIGITS)


class QSummary(BaseModel):
    """The spread of the learned utilities: quartiles and mean."""

    min: float
    p25: float
    median: float
    p75: float
    max: float
    mean: float

    @classmethod
    def of(cls, counts: Counts) -> QSummary | None:
        """Min, quartiles (linear interpolation, as ``numpy.percentile``), max and mean of a tally's Q histogram
        (None: no memory)."""
        if not counts.q_steps:
            return None
        steps = np.array(sorted(counts.q_steps), dtype=np.int64)
        weights = np.array([counts.q_steps[s] for s in steps], dtype=np.int64)
        ends = np.cumsum(weights)  # the sorted Qs of step i are at ranks ends[i-1] .. ends[i]-1
        n = int(ends[-1])

        def at(fraction: float) -> float:
            rank = fraction * (n - 1)
            low, high = int(np.floor(rank)), int(np.ceil(rank))
            value_low = steps[np.searchsorted(ends, low, side="right")]
            value_high = steps[np.searchsorted(ends, high, side="right")]
            return as_q(float(value_low + (value_high - value_low) * (rank - low)))

        return cls(
            min=as_q(float(steps[0])),
            p25=at(0.25),
            median=at(0.5),
            p75=at(0.75),
            max=as_q(float(steps[-1])),
            mean=as_q(float((steps * weights).sum()) / n),
        )


class Stats(BaseModel):
    """What a namespace (or every namespace) holds, and how much it learned."""

    namespace: str | None = Field(description="None: every namespace.")
    memories: int
    successes: int
    failures: int
    q: QSummary | None = Field(description="Distribution of q; None when there is no memory.")
    visits: int = Field(description="Rewards folded into all memories.")
    recalls_pending: int
    recalls_reported: int
    steps: int = Field(0, description="Step records (Rememberer's step memory).")
    episodes_reported: int = Field(0, description="Trajectories applied (their episode_ids are remembered).")


class EffectiveSettings(BaseModel):
    """The constants this server retrieves and learns with, after the embedder's defaults are applied: what a
    benchmark run records, so that a result can be traced to the settings behind it."""

    embedder: str
    k1: int
    k2: int
    q_weight: float
    alpha: float
    delta: float
    sim_normalization: str
    sim_mean: float
    sim_std: float
    merge_threshold: float
    epsilon: float
    q_init_success: float
    q_init_failure: float
    reward_min: float
    reward_max: float
    tool_profile: str
    step_n: int
    step_gamma: float
    step_order: str
    step_update: str
    step_learning_rate: float
    step_observation_weight: float
    step_k: int
    step_delta: float
    step_match_threshold: float
    step_advice_threshold: float
    step_max_records: int
    step_max_actions: int


# -- the step memory (Rememberer) -------------------------------------------------------------------


class ActionView(BaseModel):
    """One action tried at a remembered step."""

    model_config = ConfigDict(extra="forbid")  # an import names a stray field instead of dropping it

    action: str
    q: KeptFloat = Field(description="Q(task, observation, action): the discounted reward expected after this action.")
    visits: int = Field(description="Targets folded into q.")
    reward: KeptFloat = Field(description="Mean immediate reward right after this action.")


class StepRecordView(BaseModel):
    """A remembered step: the (task, observation) it is keyed by and the actions tried there."""

    id: str
    namespace: str
    task: str
    observation: str
    actions: list[ActionView]
    created_at: Timestamp
    updated_at: Timestamp


class MatchedStep(StepRecordView):
    """A step record matched to the current (task, observation), with how well each part matched."""

    similarity: float = Field(description="(1 - w) task_similarity + w observation_similarity.")
    task_similarity: float = Field(description="Cosine similarity of its task to the current task.")
    observation_similarity: float = Field(description="Cosine similarity of its observation to the current one.")


class StepAdvice(BaseModel):
    """An action advised at this step, with the value it was learned to have."""

    action: str
    q: KeptFloat
    visits: int


class StepAdviceResult(BaseModel):
    """Action advice for the current step: what worked here before (encouraged) and what did not (discouraged)."""

    namespace: str
    encouraged: list[StepAdvice] = Field(description="Actions whose Q is above advice_threshold, highest first.")
    discouraged: list[StepAdvice] = Field(description="Actions whose Q is at or below advice_threshold, lowest first.")
    advice_threshold: float = Field(
        description="Q above it: encouraged; at or below it: discouraged (an action that never led to a reward)."
    )
    records: list[MatchedStep] = Field(description="The matched step records, best match first.")


class StepChange(BaseModel):
    """One step's update: its record's action moved toward the step's n-step target."""

    step: int = Field(description="Index of the step in the reported trajectory.")
    record_id: str
    action: str
    target: KeptFloat = Field(description="G_t = sum_{i<n} gamma^i r_{t+i} + gamma^n max_a Q(task, o_{t+n}, a).")
    q_before: KeptFloat | None = Field(description="None: the action was new at this record.")
    q_after: KeptFloat
    visits: int
    kept: bool = Field(
        description="False: the record was over step_max_actions and this action, with the lowest mean reward, "
        "was dropped at once."
    )


class TrajectoryResult(BaseModel):
    """What a reported trajectory changed. A second report of one episode_id changes nothing and says so."""

    episode_id: str
    namespace: str
    already_applied: bool = Field(description="True: this episode_id was reported before; nothing changed now.")
    reported: bool = Field(
        True, description="False: the user declined to say how the episode went; nothing changed, report it again."
    )
    reward_source: RewardSource | None = Field(None, description="Who gave the last step's reward: agent or user.")
    steps: int = Field(description="Steps in the trajectory.")
    updated: int = Field(description="Step Q values updated (each step of an episode exactly once).")
    created: int = Field(description="New step records (a (task, observation) never seen).")
    merged: int = Field(description="Steps folded into an action already tried at the same (task, observation).")
    dropped: int = Field(description="Steps not stored: the memory was full and they were the most redundant.")
    changes: list[StepChange] = Field(
        description="Per step, its target and Q before and after (empty when already applied)."
    )
    outcome: ReportResult | None = Field(
        None, description="The episode memory's report_outcome for recall_id, with the last step's reward."
    )
    outcome_error: str | None = Field(None, description="Why the recall_id could not be reported, when it could not.")
    message: str
