"""A tiny benchmark the runner tests play: capitals, one always missed by the fake LLM."""

from __future__ import annotations

import random
from collections.abc import Sequence

from memrl_harness.benchmarks.base import Episode, Memory, Task
from memrl_harness.llm import LLM

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid"}


MISSED = "Spain"  # the fake LLM gets this one wrong every time


class CapitalsQuiz:
    """A three-task benchmark whose agent is one LLM call; the checker compares the answer."""

    name = "capitals"
    needs_llm = True

    def tasks(self) -> Sequence[Task]:
        return [Task(f"capital-{c}", f"name the capital city of {c}", {"country": c}, "geo") for c in CAPITALS]

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        assert llm is not None
        advice = "\n".join(f"[{m.outcome}] {m.experience}" for m in memories)
        prompt = f"Past experience:\n{advice or 'none'}\n\nQuestion: {task.intent}?"
        reply = llm.chat([{"role": "user", "content": prompt}])
        success = reply.text.strip() == CAPITALS[task.data["country"]]
        return Episode(
            success, 1.0 if success else -1.0, 1, f"asked: {task.intent}\nanswered: {reply.text}", usage=reply.usage
        )
