"""What each tool is asked: one typed request per tool, the same for the MCP tools, the inspector's JSON API and
Python callers of :class:`~memrl_mcp.memory.service.MemoryService`.

A request is built once at the edge (the SDK's checked arguments, a JSON body, a Python call) and handed on
unchanged: no argument travels positionally from layer to layer, where two ``str | None`` could swap unseen.
``None`` is "the server's setting" or "not given". The service checks every field (:mod:`memrl_mcp.validation`),
whoever built the request; the tool layer also offers each field as a tool argument with its bound and its
description (:class:`Arg`), so that a client is told the rules before it calls.

Adding a tool: its request here, its function in :mod:`memrl_mcp.surface.tools`, its name in a profile
(:data:`~memrl_mcp.settings.TOOL_PROFILES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, with_config

from memrl_mcp.validation import (
    MAX_CHECKS,
    MAX_EPISODE_ID_CHARS,
    MAX_K,
    MAX_METADATA_DEPTH,
    CandidateCount,
    Check,
    NamespaceName,
    Outcome,
    QWeight,
    Similarity,
    SortKey,
    TextQuery,
    TrajectoryStep,
)


@dataclass(frozen=True)
class Arg:
    """A request field as a tool argument: its ``description``, a template of the settings (``{max_task_chars}``,
    ``{reward_max:g}``: :func:`memrl_mcp.surface.schema.argument_values` lists them), and, where its bound is a
    setting, the name of the rule that holds it in :class:`~memrl_mcp.validation.Limits` (``bound``)."""

    description: str
    bound: str | None = None


REQUEST = ConfigDict(extra="forbid")  # as a JSON body (the inspector): no stray key; no coercion (Strict* fields)

Task = Annotated[StrictStr, Arg("The task at hand, in plain words (max {max_task_chars} characters).", "task")]
Namespace = Annotated[NamespaceName | None, Arg("Memory namespace (one per project or agent); default: the server's.")]
Metadata = Annotated[
    dict[str, Any] | None,
    Arg(
        "Labels kept with the memory (benchmark, task id...): a JSON object of at most {max_metadata_chars} "
        f"characters, {MAX_METADATA_DEPTH} levels deep.",
        "metadata",
    ),
]
Trajectory = Annotated[
    StrictStr | None,
    Arg(
        "Instead of experience: what happened in the task, as text (max {max_trajectory_chars} characters); the "
        "client's model writes the experience from it.",
        "trajectory",
    ),
]
K1 = Annotated[CandidateCount | None, Arg("Similar memories considered (default {k1}).")]
K2 = Annotated[CandidateCount | None, Arg("Memories returned, at most k1 (default {k2}).")]
QWeightArgument = Annotated[
    QWeight | None, Arg("0 ranks by similarity only, 1 by past usefulness only (default {q_weight:g}).")
]
Delta = Annotated[Similarity | None, Arg("Lowest task similarity a memory needs (default {delta:.2f}).")]


@with_config(REQUEST)
@dataclass(frozen=True)
class RecallQuery:
    """``recall_experience`` and ``search_experience`` (and the inspector's preview of either): the task, and
    optionally the namespace and Phase A and B's numbers. The service hands on a resolved copy (no ``None``)."""

    task: Task
    namespace: Namespace = None
    k1: K1 = None
    k2: K2 = None
    q_weight: QWeightArgument = None
    delta: Delta = None


@with_config(REQUEST)
@dataclass(frozen=True)
class OutcomeReport:
    """``report_outcome``: the reward of a recalled task, and what to remember of it. Without ``reward`` the user is
    asked; with ``trajectory`` instead of ``experience`` the client's model writes the experience
    (:mod:`memrl_mcp.surface.feedback`). The service itself takes a reward and an experience only."""

    recall_id: Annotated[StrictStr, Arg("The recall_id that recall_experience returned.")]
    reward: Annotated[
        StrictFloat | None,
        Arg(
            "How the task went, in [{reward_min:g}, {reward_max:g}]: {reward_max:g} success; {reward_min:g} failure "
            "(or the memories misled you); {reward_neutral:g} no clear outcome (partly done, no sign either way), "
            "which still pulls the recalled memories toward neutral. In a chat, where you cannot check success "
            "yourself, ask the user, or infer it from their reaction: thanks or moving on is a success; a "
            "correction, a complaint or the same request again is a failure. Leave it out and the server asks the "
            "user itself, when the client lets it.",
            "reward",
        ),
    ] = None
    experience: Annotated[
        StrictStr | None,
        Arg(
            "What to remember from this task: on success 3-5 short steps that worked; on failure what went wrong "
            "and what to avoid (max {max_experience_chars} characters).",
            "experience",
        ),
    ] = None
    outcome: Annotated[Outcome | None, Arg("success or failure; default: success when the reward is above 0.")] = None
    metadata: Metadata = None
    trajectory: Trajectory = None
    followed: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_K)]] | None,
        Field(max_length=MAX_K),
        Arg("Numbers of the recalled memories you followed (1: the first); only theirs moves. Default: all."),
    ] = None


@with_config(REQUEST)
@dataclass(frozen=True)
class EvidenceReport:
    """``record_evidence``: what happened in a recalled task, as it happened (:mod:`memrl_mcp.memory.evidence`)."""

    recall_id: Annotated[StrictStr, Arg("The recall_id of the task the evidence is about.")]
    checks: Annotated[
        list[Check],
        Field(max_length=MAX_CHECKS),
        Arg(
            "What happened since the last call, in order, at most {max_checks} at a time (none: close only): a run "
            "of a check ({{kind: tests|build|typecheck|lint|check, passed, command?, passed_count?, failed_count?}}), "
            "an edit of the files ({{kind: edit}}: earlier runs tested other code), the user's verdict "
            "({{kind: user, passed, said?}}).",
        ),
    ]
    close: Annotated[
        StrictBool,
        Arg("The task is over: report the recall with the evidence's reward, when the evidence says one."),
    ] = False


@with_config(REQUEST)
@dataclass(frozen=True)
class NewExperience:
    """``store_experience``: a lesson that no recall led to. With ``trajectory`` instead of ``experience`` the
    client's model writes the experience; the service itself takes an experience only."""

    task: Annotated[StrictStr, Arg("The task the experience is about (max {max_task_chars}).", "task")]
    experience: Annotated[
        StrictStr | None, Arg("What to reuse or avoid (max {max_experience_chars} characters).", "experience")
    ] = None
    namespace: Namespace = None
    outcome: Annotated[Outcome, Arg("success (to follow) or failure (to avoid).")] = "success"
    q: Annotated[StrictFloat | None, Arg("Initial usefulness; default: the server's.", "reward")] = None
    metadata: Metadata = None
    trajectory: Trajectory = None


@with_config(REQUEST)
@dataclass(frozen=True)
class StepQuery:
    """``recall_step_advice``: the situation of a step of a task of many steps."""

    task: Task
    observation: Annotated[
        StrictStr,
        Arg(
            "What you see now (max {max_observation_chars} characters; the head and tail of a long one are matched).",
            "observation",
        ),
    ]
    namespace: Namespace = None
    k: Annotated[CandidateCount | None, Arg("Remembered steps to match (default {step_k}).")] = None


@with_config(REQUEST)
@dataclass(frozen=True)
class TrajectoryReport:
    """``report_trajectory``: every step of an episode, once per ``episode_id``. Without the last step's reward the
    user is asked (:mod:`memrl_mcp.surface.feedback`); the service itself takes every step's reward."""

    task: Task
    steps: Annotated[
        list[TrajectoryStep],
        Arg(
            "Every step of the episode in order, at most {max_trajectory_steps}: {{observation, action, reward}}. "
            "A step's reward is what followed it at once, usually 0; the last one's is the episode's "
            "({reward_max:g} success, {reward_min:g} failure, as in report_outcome).",
            "steps",
        ),
    ]
    episode_id: Annotated[
        StrictStr,
        Field(min_length=1, max_length=MAX_EPISODE_ID_CHARS),
        Arg("Your unique id of this episode: a second report with the same id (a retry) changes nothing."),
    ]
    namespace: Namespace = None
    recall_id: Annotated[
        StrictStr | None,
        Field(max_length=36),
        Arg(
            "The recall_id of recall_experience for this episode, if any: it is reported too, with the last "
            "step's reward."
        ),
    ] = None


@with_config(REQUEST)
@dataclass(frozen=True)
class ForgetRequest:
    """``forget_experience``: one memory, or a whole namespace (exactly one of the two)."""

    memory_id: Annotated[StrictStr | None, Arg("Delete this one memory.")] = None
    namespace: Annotated[NamespaceName | None, Arg("Delete every memory, recall and step of this namespace.")] = None


@with_config(REQUEST)
@dataclass(frozen=True)
class StatsQuery:
    """``memory_stats``: one namespace, or every namespace the caller may use."""

    namespace: Annotated[NamespaceName | None, Arg("One namespace; default: all.")] = None


@with_config(REQUEST)
@dataclass(frozen=True)
class ListQuery:
    """``list_memories`` (and the inspector's memory table): a page of one namespace's memories, filtered and
    sorted; ``cursor`` is the previous page's ``next_cursor`` under the same sort."""

    namespace: Namespace = None
    outcome: Annotated[Outcome | None, Arg("Only successes, or only failures.")] = None
    q_min: Annotated[StrictFloat | None, Arg("Only memories with q >= q_min.", "reward")] = None
    q_max: Annotated[StrictFloat | None, Arg("Only memories with q <= q_max.", "reward")] = None
    text: Annotated[
        TextQuery | None, Arg("Only memories whose task or experience holds every word of this text (any case).")
    ] = None
    sort: Annotated[SortKey, Arg("q (learned usefulness), visits, or updated_at.")] = "updated_at"
    descending: Annotated[StrictBool, Arg("Highest first (default).")] = True
    limit: Annotated[StrictInt | None, Arg("Memories per page (default 20, max {max_list_page}).", "page")] = None
    cursor: Annotated[StrictStr | None, Field(max_length=512), Arg("next_cursor of the previous page (same sort).")] = (
        None
    )


@with_config(REQUEST)
@dataclass(frozen=True)
class MemoryEdit:
    """``update_memory`` (and the inspector's edit form): a new experience and/or metadata for one memory, or its
    learned Q forgotten (``reset_q``)."""

    memory_id: Annotated[StrictStr, Field(max_length=36), Arg("The memory to correct.")]
    experience: Annotated[
        StrictStr | None, Arg("Its new experience text (max {max_experience_chars} characters).", "experience")
    ] = None
    metadata: Metadata = None
    reset_q: Annotated[StrictBool, Arg("Forget what was learned: q back to its initial value and visits to 0.")] = False
