"""What a benchmark is to the harness: a list of tasks and one episode at a time.

A benchmark module provides tasks (with the intent text recall is keyed by) and runs one episode
of one task with the memories recall handed out, returning the reward of the benchmark's own
checker. Everything else (memory calls, epochs, workers, experiences, metrics) is the runner's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

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


@dataclass
class Episode:
    """What one attempt gave: the checker's verdict and reward, and what to learn from it.

    ``experience`` is set by benchmarks that write their own (the LLM-free one); otherwise the
    runner asks the LLM to turn ``trajectory`` into a procedure (success) or a reflection (failure).
    """

    success: bool
    reward: float
    steps: int
    trajectory: str
    experience: str | None = None
    usage: Usage = field(default_factory=Usage)


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
