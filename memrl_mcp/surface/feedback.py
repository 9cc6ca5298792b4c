"""Rewards and experiences from the client: what a report asks the user and the client's model for, and then makes.

MemRL learns only from rewards, and keeps only the experiences someone wrote. In a chat the agent often cannot see
whether a task succeeded, and writes a poor experience; the user can see it, and the client's own model can write
one. MCP gives the server both (:mod:`~memrl_mcp.surface.asking`):

- **A reward from the user.** A report without ``reward`` (``report_outcome``; the last step of
  ``report_trajectory``) asks the user through MCP elicitation: a form of one required boolean, ``succeeded``, and an
  optional ``note``, with a message naming the task and the memories it was given. Accepted: the reward is
  ``user_success_reward`` or ``user_failure_reward`` (default ``reward_max`` / ``reward_min``), reported once like
  any reward, the user's note kept in the Q history. Declined or dismissed: nothing changes, the recall (or the
  episode id) stays reportable, and the result says so. A client that offers no elicitation is told to pass
  ``reward``. Everything is checked before the user is asked: a report that would be refused is never asked about.
- **An experience from a model.** ``report_outcome`` and ``store_experience`` take ``trajectory`` (the episode as
  text, at most ``max_trajectory_chars``) instead of ``experience``: the client's model writes the experience
  through MCP sampling (:mod:`~memrl_mcp.surface.distill`: a success becomes a procedure, a failure a reflection),
  else the configured endpoint (``distill_base_url``), else the call is refused. Each token may have at most
  ``max_samplings_per_minute`` experiences written (:class:`Budget`); a model's answer is checked as any experience.

While a report asks, it holds its recall (or episode_id) and one of its token's ``max_open_questions_per_token``
places: another report of the same recall, or one beyond the token's places, is refused before its client is asked
(:class:`~memrl_mcp.surface.asking.OpenQuestions`). Without a token, each session of the local server has bounds of
its own (:data:`~memrl_mcp.surface.asking.SESSION`), from its own settings: one session's questions and samplings
never refuse another's.

A report is all or nothing: if the model's answer is refused, or no answer comes within the time allowed, nothing
is reported (the user's answer too is dropped: the recall stays reportable, and is asked about again).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio.to_thread
from mcp_types import CreateMessageResult, ElicitRequest, ElicitRequestFormParams, ElicitResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import evidence
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.episodes import PendingRecall
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import (
    AGENT,
    ExperienceSource,
    MemoryView,
    Provenance,
    ReportResult,
    StoreResult,
    TrajectoryResult,
    iso_time,
)
from memrl_mcp.redaction import redacted
from memrl_mcp.requests import NewExperience, OutcomeReport, TrajectoryReport
from memrl_mcp.settings import Settings
from memrl_mcp.surface.asking import Asking, Holder, OpenQuestions, Subject
from memrl_mcp.surface.distill import Endpoint, answered_text, checked, distill_request
from memrl_mcp.validation import Outcome, check_step_rewards, outcome_of, plain_error, text_rule

R = TypeVar("R")
MAX_NOTE_CHARS = 500
SHOWN_TASK_CHARS = 300
SHOWN_EXPERIENCE_CHARS = 100
SHOWN_MEMORIES = 3
FULL_SECONDS = 60.0  # a bucket of Budget untouched this long is full again: the same as none
ANSWERS = {"decline": "declined to answer", "cancel": "dismissed the question"}


class RewardAnswer(BaseModel):
    """The user's answer, as the form asks for it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    succeeded: bool
    note: str | None = Field(None, max_length=MAX_NOTE_CHARS)


REWARD_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "succeeded": {
            "type": "boolean",
            "title": "Did it succeed?",
            "description": "Yes if the task was done the way you wanted.",
        },
        "note": {
            "type": "string",
            "title": "Note (optional)",
            "description": "What went wrong, or what to remember next time.",
            "maxLength": MAX_NOTE_CHARS,
        },
    },
    "required": ["succeeded"],
}


@dataclass(frozen=True)
class Verdict:
    """What the user answered (``answer``), and when accepted, whether the task succeeded, with the note and the
    reward it makes (None: declined or dismissed)."""

    answer: Literal["accept", "decline", "cancel"]
    succeeded: bool = False
    reward: float | None = None
    note: str | None = None

    @property
    def said(self) -> str:
        note = f" (note: {self.note})" if self.note else ""
        return f"the user said the task {'succeeded' if self.succeeded else 'failed'}: reward {self.reward:g}{note}"


class Budget:
    """At most ``per_minute`` per key in a minute, on average: a bucket of that many, refilled continuously (a burst
    of ``per_minute`` at once, then one every 60 / ``per_minute`` seconds). Kept by this process, so each replica of a
    server keeps its own; under a lock, since the local server's sessions share it from threads of their own. A full
    bucket is forgotten: the keys (the local server's sessions come and go) do not pile up."""

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._levels: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> bool:
        with self._lock:
            return self._take(key)

    def _take(self, key: str) -> bool:
        now = self._clock()
        self._levels = {held: (level, at) for held, (level, at) in self._levels.items() if now - at < FULL_SECONDS}
        level, at = self._levels.get(key, (float(self._per_minute), now))
        level = min(float(self._per_minute), level + max(0.0, now - at) * self._per_minute / 60.0)
        taken = level >= 1.0
        self._levels[key] = (level - taken, now)
        return taken


def open_questions(service: MemoryService) -> OpenQuestions:
    """The open questions of the reports over ``service``, each held up to the longest a report may wait."""
    learning = service.settings.learning
    longest_wait = learning.elicitation_timeout_seconds + learning.distill_timeout_seconds
    return OpenQuestions(longest_wait, service.clock)


class Feedback:
    """The reports that ask the client (module docstring), over one service. ``settings``: those of the clients when
    they are not the service's (a session of the local server), whose bounds they get; ``questions``: the open
    questions shared with other servers over the same service (the local server's), else its own."""

    def __init__(
        self,
        service: MemoryService,
        reports_on_loop: bool = False,
        settings: Settings | None = None,
        questions: OpenQuestions | None = None,
    ) -> None:
        self._service = service
        self._reports_on_loop = reports_on_loop
        serving = (settings or service.settings).serving
        settings = service.settings  # the memory's own groups
        self._learning = settings.learning
        self._trajectory = text_rule(settings.limits.max_trajectory_chars)
        self._note = text_rule(MAX_NOTE_CHARS)
        self._per_minute = serving.max_samplings_per_minute
        self._budget = Budget(self._per_minute, service.clock)
        self._open_limit = serving.max_open_questions_per_token
        self._questions = questions or open_questions(service)
        learning = self._learning
        self._endpoint = (
            None
            if learning.distill_base_url is None or learning.distill_model is None
            else Endpoint(learning.distill_base_url, learning.distill_model, learning.distill_api_key)
        )

    async def _run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """A service call (it blocks on the store): in a worker thread."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    # -- the tools ------------------------------------------------------------------------------------

    async def report(self, report: OutcomeReport, client: Asking, *, access: Access) -> ReportResult:
        """``report_outcome``: the reward, else the user's; the experience, else one a model writes from the
        trajectory; then the report."""
        self._one_of(report.experience, report.trajectory)
        if report.reward is not None and report.trajectory is None:  # nobody to ask: the hot path of the loop
            if self._reports_on_loop:
                return self._service.report(report, access=access)
            return await self._run(self._service.report, report, access=access)
        trajectory = self._checked_trajectory(client, report.trajectory)
        recall_id, reward, outcome = report.recall_id, report.reward, report.outcome
        recall = await self._run(self._service.reportable, recall_id, access=access)
        happened = evidence.verdict(recall.record.evidence)  # when it says how the task went, nobody is asked
        if reward is None and happened is None:
            self._can_ask_user(client)
        provenance, verdict, experience = AGENT, None, report.experience
        subject = Subject("recall_id", recall_id)
        with (
            self._questions.held(client, self._holder(access), [subject]),
            _unreported(f"recall {recall_id} stays reportable"),
        ):
            if reward is None and happened is None:
                verdict = await self._ask_user(client, _recall_question(recall))
                if verdict.reward is None:
                    return ReportResult(
                        recall_id=recall_id,
                        reported=False,
                        reward=None,
                        updated=[],
                        missing=[],
                        stored=None,
                        message=f"the user {ANSWERS[verdict.answer]}: nothing was reported. The recall stays "
                        f"reportable until {iso_time(recall.record.expires_at)}: report it again, with a reward if "
                        "you can tell how the task went.",
                    )
                reward, provenance = verdict.reward, Provenance(reward="user", note=verdict.note)
            if happened is not None:
                outcome = "success" if happened.succeeded else "failure"
            elif reward is not None:
                outcome = outcome or outcome_of(reward, self._learning.reward_scale.neutral)
            if trajectory is not None and outcome is not None:  # no clear outcome: nothing to write
                task = recall.record.task
                experience, source = await self._distill(client, access, task, trajectory, outcome, provenance)
                provenance = dataclasses.replace(provenance, experience=source)
        answered = dataclasses.replace(report, reward=reward, experience=experience, outcome=outcome, trajectory=None)
        result = await self._run(self._service.report, answered, access=access, provenance=provenance)
        if verdict is not None:
            result.message = verdict.said
        return result

    async def store(self, new: NewExperience, client: Asking, *, access: Access) -> StoreResult:
        """``store_experience``: the experience, else one a model writes from the trajectory."""
        self._one_of(new.experience, new.trajectory)
        if new.experience is None and new.trajectory is None:
            raise MemoryRequestError("experience: required (or trajectory, for a model to write it from)")
        trajectory = self._checked_trajectory(client, new.trajectory)
        source: ExperienceSource = "agent"
        if trajectory is not None:
            await self._run(self._service.namespace_of, new.namespace, access)  # a refusal before a model is asked
            with self._questions.held(client, self._holder(access)), _unreported("nothing was stored"):
                experience, source = await self._distill(client, access, new.task, trajectory, new.outcome, AGENT)
            new = dataclasses.replace(new, experience=experience, trajectory=None)
        return await self._run(self._service.store_experience, new, access=access, source=source)

    async def report_trajectory(self, report: TrajectoryReport, client: Asking, *, access: Access) -> TrajectoryResult:
        """``report_trajectory``: the last step's reward, else the user's; then the report."""
        provenance, verdict = AGENT, None
        steps, episode_id, recall_id = report.steps, report.episode_id, report.recall_id
        if steps and steps[-1].reward is None:
            check_step_rewards(steps, last_may_lack=True)
            self._can_ask_user(client)
            already = await self._run(self._service.applied_trajectory, report, access=access)
            if already is not None:
                return already
            recall = None if recall_id is None else await self._run(self._service.reportable, recall_id, access=access)
            question = _episode_question(report.task, steps, recall)
            subjects = [Subject("episode_id", episode_id, self._service.namespace_of(report.namespace, access))]
            subjects += [] if recall_id is None else [Subject("recall_id", recall_id)]
            with (
                self._questions.held(client, self._holder(access), subjects),
                _unreported(f"episode_id {episode_id!r} stays reportable"),
            ):
                verdict = await self._ask_user(client, question)
            if verdict.reward is None:
                return TrajectoryResult(
                    episode_id=episode_id,
                    namespace=self._service.namespace_of(report.namespace, access),
                    already_applied=False,
                    reported=False,
                    steps=len(steps),
                    updated=0,
                    created=0,
                    merged=0,
                    dropped=0,
                    changes=[],
                    message=f"the user {ANSWERS[verdict.answer]}: nothing was reported. Report episode_id "
                    f"{episode_id!r} again, with the last step's reward if you can tell how the episode went.",
                )
            answered = [*steps[:-1], steps[-1].model_copy(update={"reward": verdict.reward})]
            report = dataclasses.replace(report, steps=answered)
            provenance = Provenance(reward="user", note=verdict.note)
        result = await self._run(self._service.report_trajectory, report, access=access, provenance=provenance)
        if verdict is not None and not result.already_applied:
            result.message = f"{verdict.said}; {result.message}"
        return result

    def _holder(self, access: Access) -> Holder:
        return Holder.of(access.client, self._open_limit)

    # -- the user -------------------------------------------------------------------------------------

    def _can_ask_user(self, client: Asking) -> None:
        lacking = client.lacks("elicitation")
        if lacking is not None:
            raise MemoryRequestError(
                f"reward: required: {lacking}. Pass reward yourself: {self._learning.reward_scale}; ask the user in "
                "the chat if you cannot tell."
            )

    async def _ask_user(self, client: Asking, message: str) -> Verdict:
        request = ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=REWARD_FORM))
        try:
            result = await client.ask("reward", request, ElicitResult, self._learning.elicitation_timeout_seconds)
        except ValidationError:
            raise MemoryRequestError("reward: the client's answer to the question is no elicitation result") from None
        if result.action != "accept":
            return Verdict(result.action)
        try:
            answer = RewardAnswer.model_validate(result.content or {})
        except ValidationError as error:
            raise MemoryRequestError("reward: the user's answer: " + plain_error(error.errors()[0])) from None
        said = answer.note.strip() if answer.note else ""
        note = redacted(self._note.check("note", said), MAX_NOTE_CHARS) if said else None  # kept, and said back
        return Verdict("accept", answer.succeeded, self._learning.user_reward(answer.succeeded), note)

    # -- the model ------------------------------------------------------------------------------------

    def _one_of(self, experience: str | None, trajectory: str | None) -> None:
        if experience is not None and trajectory is not None:
            raise MemoryRequestError("trajectory: give experience or trajectory, not both")

    def _checked_trajectory(self, client: Asking, trajectory: str | None) -> str | None:
        """The trajectory, checked, when a model can be asked for its experience; else a refusal."""
        if trajectory is None:
            return None
        trajectory = self._trajectory.check("trajectory", trajectory)
        lacking = client.lacks("sampling")
        if lacking is not None and self._endpoint is None:
            raise MemoryRequestError(
                f"trajectory: {lacking}, and this server has no distill_base_url to ask instead: write the "
                "experience yourself (on success 3-5 steps that worked, on failure what to avoid) and pass experience"
            )
        return trajectory

    async def _distill(
        self, client: Asking, access: Access, task: str, trajectory: str, outcome: Outcome, provenance: Provenance
    ) -> tuple[str, ExperienceSource]:
        """The experience a model writes from ``trajectory``: the client's, else the endpoint (module docstring)."""
        learning = self._learning
        request = distill_request(task, trajectory, outcome, provenance.note, learning.distill_max_tokens)
        rule, timeout = self._service.limits.experience, learning.distill_timeout_seconds

        def spend() -> None:
            holder = self._holder(access)
            if not self._budget.take(holder.key):
                raise MemoryRequestError(
                    f"trajectory: {holder.name} had {self._per_minute} experiences written in the last minute "
                    f"(max_samplings_per_minute={self._per_minute}); pass experience instead, or try again later"
                )

        if client.lacks("sampling") is None:
            try:
                result = await client.ask("experience", request, CreateMessageResult, timeout, spend)
            except ValidationError:
                raise MemoryRequestError(
                    "experience: the client's model answered with something other than one text message (tool use?); "
                    "nothing stored"
                ) from None
            return answered_text(result, rule, "the client's model"), "client_model"
        assert self._endpoint is not None, "checked by _checked_trajectory"
        spend()
        return checked(await self._endpoint.complete(request, timeout), rule, "distill_base_url"), "endpoint"


@contextmanager
def _unreported(stays: str) -> Iterator[None]:
    """A refusal after the checks (no answer, a bad answer, no budget) says that nothing was reported."""
    try:
        yield
    except MemoryRequestError as error:
        raise type(error)(f"{error}. Nothing was reported: {stays}.") from None


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _recall_question(recall: PendingRecall) -> str:
    """The message of the question about a recall: the task, and the memories it gave."""
    return (
        "How did this task go? Your answer teaches the memory which past experiences help.\n\n"
        f"Task: {_clip(recall.record.task, SHOWN_TASK_CHARS)}\n" + _memories(recall.memories)
    )


def _episode_question(task: str, steps: list[Any], recall: PendingRecall | None) -> str:
    """The message of the question about an episode of many steps: its task, its last action, and the memories its
    recall gave."""
    text = (
        "How did this task go? Your answer teaches the memory which steps help.\n\n"
        f"Task: {_clip(task, SHOWN_TASK_CHARS)}\n"
        f"{len(steps)} steps; the last: {_clip(steps[-1].action, SHOWN_EXPERIENCE_CHARS)}\n"
    )
    return text + ("" if recall is None else _memories(recall.memories))


def _memories(memories: list[MemoryView]) -> str:
    if not memories:
        return "No past experience was used (a new kind of task)."
    shown = "".join(
        f"\n- {m.outcome}: {_clip(m.experience, SHOWN_EXPERIENCE_CHARS)}" for m in memories[:SHOWN_MEMORIES]
    )
    more = f"\n(and {len(memories) - SHOWN_MEMORIES} more)" if len(memories) > SHOWN_MEMORIES else ""
    return f"Past experiences used:{shown}{more}"
