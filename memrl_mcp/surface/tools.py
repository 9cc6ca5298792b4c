"""The MCP tools: one function each, over its typed request (:mod:`memrl_mcp.requests`); the docstring is the tool's
description, as the agent reads it. :data:`TOOLS` holds them in the order a client lists them; the ``tool_profile``
setting chooses which are offered (:data:`~memrl_mcp.settings.TOOL_PROFILES`).

Adding a tool: its request in :mod:`memrl_mcp.requests`, its function here, its name in a profile."""

from __future__ import annotations

from typing import Any

from mcp.types import ToolAnnotations

from memrl_mcp.memory.access import Access
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import (
    EvidenceResult,
    ForgetResult,
    MemoryDetail,
    MemoryPage,
    RecallResult,
    ReportResult,
    SearchResult,
    Stats,
    StepAdviceResult,
    StoreResult,
    TrajectoryResult,
)
from memrl_mcp.requests import (
    EvidenceReport,
    ForgetRequest,
    ListQuery,
    MemoryEdit,
    NewExperience,
    OutcomeReport,
    RecallQuery,
    StatsQuery,
    StepQuery,
    TrajectoryReport,
)
from memrl_mcp.surface.calls import ToolCall, ToolDef, tool
from memrl_mcp.surface.text import shown

TOOLS: dict[str, ToolDef[Any]] = {}
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
RETRIED = WRITES.model_copy(update={"idempotent_hint": True})
CORRECTS = WRITES.model_copy(update={"destructive_hint": True})
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
DESTROYS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


def _cached_task(service: MemoryService, query: RecallQuery, access: Access) -> bool:
    """A recall whose task's embedding is cached runs no model: a millisecond or two of store calls, served on the
    event loop of a one-client server (only that client's own requests wait with it)."""
    return not service.runs_model(query, access=access)


@tool(TOOLS, "Recall past experience", WRITES, on_loop=_cached_task)
def recall_experience(query: RecallQuery, call: ToolCall) -> RecallResult:
    """Call at the start of every task, before acting. Returns past experiences of similar tasks, best first
    (ranked by similarity and by how much each helped before), and a recall_id. Follow the procedures of the
    successes; avoid what the failures warn about. No memory is a valid answer (a new kind of task). When the
    task is over, call report_outcome with the recall_id, once."""
    return shown(call.service.recall(query, access=call.access), call.recall_chars)


@tool(TOOLS, "Report a task's outcome", WRITES)
async def report_outcome(report: OutcomeReport, call: ToolCall) -> ReportResult:
    """Call once when the task is over (done, failed or abandoned), with the recall_id of recall_experience.
    The reward teaches the memory which of the recalled experiences help; the experience is kept as a new
    memory for the next similar task."""
    return await call.feedback.report(report, call.client, access=call.access)


@tool(TOOLS, "Record what happened in a task", WRITES)
def record_evidence(report: EvidenceReport, call: ToolCall) -> EvidenceResult:
    """Hand in what happened in a recalled task as it happens: test runs, builds, type checks and lints (passed or
    failed, with counts), edits of the files, the user's verdict. Then the evidence decides the recall's reward,
    not the agent's word: the user's first, else the checks run after the last edit. close reports the recall with
    it once the task is over; a recall reported a moment ago has its reward corrected by later evidence."""
    return call.service.record_evidence(report, access=call.access)


@tool(TOOLS, "Store an experience", RETRIED)
async def store_experience(new: NewExperience, call: ToolCall) -> StoreResult:
    """Keep a lesson that no recall led to: something the user asks you to remember, or a procedure learned
    outside a task. After a recalled task, report_outcome stores its experience and also teaches the memory.
    A near-duplicate task with the same outcome updates that memory instead of adding a twin."""
    return await call.feedback.store(new, call.client, access=call.access)


@tool(TOOLS, "Advice for this step", READS)
def recall_step_advice(query: StepQuery, call: ToolCall) -> StepAdviceResult:
    """For a task of many steps (a game, a shell or database session): call at each step with what you see
    now. Returns the actions that led to success in similar situations (encouraged) and those that did not
    (discouraged). Read-only. At the end of the episode, report every step with report_trajectory."""
    return call.service.recall_step_advice(query, access=call.access)


@tool(TOOLS, "Report a task of many steps", RETRIED)
async def report_trajectory(report: TrajectoryReport, call: ToolCall) -> TrajectoryResult:
    """Call once at the end of a task of many steps, with every step: the step memory learns which actions led
    to success and which went wrong, and recall_step_advice will say so."""
    return await call.feedback.report_trajectory(report, call.client, access=call.access)


@tool(TOOLS, "Search memories without learning", READS)
def search_experience(query: RecallQuery, call: ToolCall) -> SearchResult:
    """Look memories up like recall_experience, without a recall: nothing is logged, there is nothing to
    report, and nothing learns from this use. For browsing, or a retrieval-only baseline; an agent working on
    a task calls recall_experience instead."""
    return shown(call.service.search(query, access=call.access), call.recall_chars)


@tool(TOOLS, "List memories", READS)
def list_memories(query: ListQuery, call: ToolCall) -> MemoryPage:
    """Page through what the memory holds: each memory's task, experience, outcome, learned usefulness q
    (the reward it brought on average), visits and last reward. One memory's history of q is the resource
    memrl://memories/{id}."""
    return call.service.list_memories(query, access=call.access)


@tool(TOOLS, "Correct a memory", CORRECTS)
def update_memory(edit: MemoryEdit, call: ToolCall) -> MemoryDetail:
    """Correct a memory: replace its experience and/or its metadata (the limits of store_experience). Its task,
    outcome, q and visits stay, unless reset_q forgets what was learned."""
    return call.service.update_memory(edit, access=call.access)


@tool(TOOLS, "Forget memories", DESTROYS)
def forget_experience(request: ForgetRequest, call: ToolCall) -> ForgetResult:
    """Delete one memory by id, or all of a namespace (give exactly one of the two). It cannot be undone."""
    return call.service.forget(request, access=call.access)


@tool(TOOLS, "Memory statistics", READS)
def memory_stats(query: StatsQuery, call: ToolCall) -> Stats:
    """Counts of memories (successes, failures), the spread of their learned usefulness q, rewards received,
    recalls pending and reported, step records."""
    return call.service.stats(query, access=call.access)
