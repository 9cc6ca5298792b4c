"""How faithfully the agent runs the memory's loop, and what the Claude Code plugin's hooks do about it.

MemRL learns only from an episode that recalls before the task and reports after it. The runner's agent is one of:

- ``disciplined``: recalls before every task and reports after it (the runner's protocol, and the default);
- ``forgetful``: in a share ``lapse_rate`` of its tasks (drawn per episode, seeded) it forgets one of the two, either
  alike: it acts without recalling (no memory in its context; nothing to report, so the episode teaches nothing), or
  it recalls and never reports (the recall stays pending: no Q update, no new memory);
- ``hooked``: the same forgetful agent (the same draws) in a client whose hooks run the loop for it, as the plugin's
  do. ``UserPromptSubmit`` recalls for the prompt before the model acts, whatever the model would have done, and puts
  the memories and the recall id into its context (so the model recalls no second time); ``Stop``, at the end of the
  model's turn, blocks once when a recall of the session is unreported, with a reason that names ``report_outcome``,
  the recall id and the reward to give, and the model reports then. :class:`HookedSession` keeps that contract.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal, get_args

Discipline = Literal["disciplined", "forgetful", "hooked"]
DISCIPLINES: tuple[Discipline, ...] = get_args(Discipline)
Lapse = Literal["recall", "report"]
RecallBy = Literal["agent", "hook"]
ReportBy = Literal["agent", "stop hook"]
DEFAULT_LAPSE_RATE = 0.6


def lapse(discipline: Discipline, rate: float, rng: random.Random) -> Lapse | None:
    """What the agent forgets in one episode: nothing (a disciplined agent, or a forgetful one this time), else the
    recall or the report, one as likely as the other."""
    if discipline == "disciplined" or rng.random() >= rate:
        return None
    return rng.choice(get_args(Lapse))


@dataclass
class HookedSession:
    """One session as the plugin's hooks see it: the recalls made in it, those reported, and those the Stop hook has
    already blocked for (it blocks at most once per recall)."""

    recalls: list[str] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)
    blocked_for: set[str] = field(default_factory=set)

    def recalled(self, recall_id: str) -> None:
        self.recalls.append(recall_id)

    def report_made(self, recall_id: str) -> None:
        self.reported.add(recall_id)

    def stop(self, stop_hook_active: bool) -> str | None:
        """The Stop hook's decision: the recall id it blocks the stop for (the model must report it), or None to let
        the session stop. Never while a stop it caused is under way (``stop_hook_active``), never twice for a
        recall."""
        if stop_hook_active:
            return None
        for recall_id in self.recalls:
            if recall_id not in self.reported and recall_id not in self.blocked_for:
                self.blocked_for.add(recall_id)
                return recall_id
        return None
