"""How the agent judges its own work, and whether what happened reaches the memory another way.

What an agent reports as its reward is its claim, and models over-report success. The runner's agent (mode memrl)
judges each episode, seeded per episode:

- ``honest``: says what happened (the checker's verdict; the default, and what the runner always reported before);
- ``noisy``: judges wrongly in a share :data:`NOISE` of its tasks;
- ``sycophantic``: says "success" in a share :data:`SYCOPHANCY` of its tasks, whatever happened.

``evidence`` says whether the environment's outcome reaches the memory beside the claim: ``none``, the claim alone;
``hooks``, the agent works in a Claude Code session with the plugin's real hooks (:mod:`memrl_harness.plugin`), and
the run of the benchmark's checker is a test run in its shell, which the hooks hand the memory as evidence
(docs/algorithm.md, "Rewards from what happened").
"""

from __future__ import annotations

import random
from typing import Literal, get_args

Judgement = Literal["honest", "noisy", "sycophantic"]
JUDGEMENTS: tuple[Judgement, ...] = get_args(Judgement)
Evidence = Literal["none", "hooks"]
EVIDENCE: tuple[Evidence, ...] = get_args(Evidence)
NOISE = 0.1
SYCOPHANCY = 0.9


def claims_success(judgement: Judgement, succeeded: bool, rng: random.Random) -> bool:
    """Whether the agent says its episode succeeded (module docstring); ``rng``: the episode's own draw."""
    roll = rng.random()
    if judgement == "noisy":
        return succeeded != (roll < NOISE)
    if judgement == "sycophantic":
        return roll < SYCOPHANCY
    return succeeded
