"""How faithfully the agent runs the memory's loop, and what the Claude Code plugin's hooks do about it.

MemRL learns only from an episode that recalls before the task and reports after it. The runner's agent is one of:

- ``disciplined``: recalls before every task and reports after it (the runner's protocol, and the default);
- ``forgetful``: in a share ``lapse_rate`` of its tasks (drawn per episode, seeded) it forgets one of the two, either
  alike: it acts without recalling (no memory in its context; nothing to report, so the episode teaches nothing), or
  it recalls and never reports (the recall stays pending: no Q update, no new memory);
- ``hooked``: the same forgetful agent (the same draws) in Claude Code sessions with the plugin's real hooks
  (:mod:`memrl_harness.plugin`), which run the loop for it: ``UserPromptSubmit`` recalls for the prompt before the
  model acts, whatever the model would have done, and puts the memories and the recall id into its context (so the
  model recalls no second time); ``Stop``, at the end of the model's turn, holds it once while the recall is
  unreported, with a reason that names ``report_outcome`` and the recall id, and the model reports then. When it did
  not forget, it reports on its own the recall its context named (a prompt that found no memory adds no context:
  the hold names the recall).
"""

from __future__ import annotations

import random
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
