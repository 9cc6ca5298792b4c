"""What a benchmark is to the harness: a list of tasks and one episode at a time.

A benchmark module provides tasks (with the intent text recall is keyed by) and runs one episode
of one task with the memories recall handed out, returning the reward of the benchmark's own
checker. Everything else (memory calls, epochs, workers, experiences, metrics) is the runner's.

A multi-step benchmark (:class:`StepwiseBenchmark`: ALFWorld, LLB OS and DB) takes several decisions per
episode, each on an observation. Its episode loop has one hook, :class:`Steps`: before each decision it asks
``steps.advise(observation)`` and shows the advice (Rememberer's encouraged and discouraged actions) with the
observation; after it, ``steps.took(observation, action)``. The runner owns what is behind the hook (the step
memory, or nothing) and reports the steps taken at the end.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from memrl_harness.llm import LLM, Usage


@dataclass(frozen=True)
class Task:
    """One task: a stable id, the intent text memory is keyed by, and the benchmark's own data."""

    id: str
    intent: str
    data: Mapping[str, Any] = field(default_factory=dict)
    type: str | None = None  # a group the report breaks results down by (ALFWorld: put, clean, ...)


@dataclass(frozen=True)
class Memory:
    """A memory as the agent sees it: successes are examples to follow, failures mistakes to avoid."""

    id: str
    task: str
    experience: str
    outcome: Literal["success", "failure"]
    q: float
    similarity: float


@dataclass(frozen=True)
class ShellRun:
    """A command the agent ran in its shell to check its work, as the agent's tool event shows it to the hooks: the
    command line, its exit code and its output (a test runner's summary line among it)."""

    command: str
    exit_code: int
    output: str


def as_test_run(success: bool, test: str) -> ShellRun:
    """A checker that is no program, as a test runner shows its verdict: pytest's summary line and exit code (so the
    hooks read it as any test run of the session)."""
    if success:
        return ShellRun("pytest -q", 0, "1 passed in 0.01s\n")
    return ShellRun("pytest -q", 1, f"FAILED {test}\n1 failed in 0.01s\n")


@dataclass
class Episode:
    """What one attempt gave: the checker's verdict and reward, and what to learn from it.

    ``experience`` is set by benchmarks that write their own (the LLM-free ones); otherwise the
    runner asks the LLM to turn ``trajectory`` into a procedure (success) or a reflection (failure).
    ``mistaken_experience`` is what such a benchmark's agent writes when it takes the outcome for the other one (an
    agent that judges its own work wrongly: memrl_harness/judgement.py). ``check`` is the run of the checker as the
    agent's shell showed it, after it edited the files ``edited``: what the plugin's hooks see of the episode.
    """

    success: bool
    reward: float
    steps: int
    trajectory: str
    experience: str | None = None
    usage: Usage = field(default_factory=Usage)
    mistaken_experience: str | None = None
    check: ShellRun | None = None
    edited: tuple[str, ...] = ()


@dataclass(frozen=True)
class SeededMemory:
    """A memory the benchmark's world holds before the run begins (what an agent stored once): stored first in every
    mode with a memory."""

    task: str
    experience: str
    outcome: Literal["success", "failure"] = "success"


@runtime_checkable
class Seeded(Protocol):
    """A benchmark whose memory does not start empty."""

    def seeded(self) -> Sequence[SeededMemory]: ...


def memory_sections(memories: Sequence[Memory], noun: str = "task") -> list[str]:
    """The recalled memories as prompt sections, as MemRL injects them: successes are examples to
    follow, failures are mistakes to avoid (best-ranked first, as recall returned them)."""
    follow = [m for m in memories if m.outcome == "success"]
    avoid = [m for m in memories if m.outcome == "failure"]
    label = noun.capitalize()
    sections = []
    if follow:
        sections.append(
            f"Experiences that worked on similar {noun}s (follow them where they apply):\n"
            + "\n".join(f"- {label}: {m.task}\n  Experience: {m.experience}" for m in follow)
        )
    if avoid:
        sections.append(
            f"Mistakes made on similar {noun}s (avoid them):\n"
            + "\n".join(f"- {label}: {m.task}\n  Reflection: {m.experience}" for m in avoid)
        )
    return sections


class Benchmark(Protocol):
    """One benchmark: its tasks and its episode. ``run_episode`` is called from worker threads."""

    name: str
    needs_llm: bool

    def tasks(self) -> Sequence[Task]: ...

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode: ...


# --- the step memory's hook (Rememberer) -----------------------------------------------------------------


@dataclass(frozen=True)
class ActionAdvice:
    """One action the step memory has seen at a matching (task, observation): its Q value and how often it was tried."""

    action: str
    q: float
    visits: int


@dataclass(frozen=True)
class StepAdvice:
    """What the step memory advises at one observation: actions to prefer (high Q) and to avoid (low Q)."""

    encouraged: tuple[ActionAdvice, ...] = ()
    discouraged: tuple[ActionAdvice, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.encouraged or self.discouraged)

    def section(self) -> str:
        """The advice as a prompt section, in Rememberer's shape: the actions with their value and how often they
        were tried, so the agent can weigh one lucky try against a well-worn path ('' when there is none)."""
        if not self:
            return ""

        def lines(items: tuple[ActionAdvice, ...]) -> str:
            return "\n".join(f"- {a.action} (value {a.q:+.2f}, tried {a.visits}x)" for a in items)

        parts = ["Advice from earlier episodes at a similar point of a similar task:"]
        if self.encouraged:
            parts.append("Encouraged actions (they led to success; prefer them):\n" + lines(self.encouraged))
        if self.discouraged:
            parts.append("Discouraged actions (they led to failure; avoid them):\n" + lines(self.discouraged))
        return "\n".join(parts)


@dataclass(frozen=True)
class Step:
    """One decision taken: the observation it was taken on and the action."""

    observation: str
    action: str


class Steps:
    """The step memory's hook in a multi-step episode loop: advice before each decision, the decision after it.

    ``recall`` maps an observation to advice (the runner's bridge to ``recall_step_advice``); without it there is
    no advice, so a benchmark's loop is the same in every mode. The steps taken are kept for the report.
    """

    def __init__(self, recall: Callable[[str], StepAdvice] | None = None) -> None:
        self._recall = recall
        self.taken: list[Step] = []
        self.advised = 0  # decisions that were given some advice

    def advise(self, observation: str) -> StepAdvice:
        advice = self._recall(observation) if self._recall else StepAdvice()
        self.advised += bool(advice)
        return advice

    def took(self, observation: str, action: str) -> None:
        self.taken.append(Step(observation, action))


def with_advice(messages: Sequence[Mapping[str, str]], advice: StepAdvice) -> list[dict[str, str]]:
    """A chat for one call: the advice appended to its last (user) message only, so the kept history never holds
    advice given on an earlier observation."""
    chat = [dict(m) for m in messages]
    if advice:
        chat[-1]["content"] = f"{chat[-1]['content']}\n\n{advice.section()}"
    return chat


class StepwiseBenchmark(ABC):
    """A benchmark whose episode is a sequence of decisions on observations; only these take the step-memory modes
    (a one-decision task has no later step for step memory to advise)."""

    @abstractmethod
    def run_steps(
        self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random, steps: Steps
    ) -> Episode:
        """One episode, asking ``steps`` for advice before each decision and telling it each action taken."""

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        return self.run_steps(task, memories, llm, rng, Steps())
