"""What counts as evidence of a task's outcome, and how the reward of a recall is decided from it: the rule is pure,
small and the same for every client (the plugin's hooks, other agents' hooks, a plain MCP client's
``record_evidence``).

A model over-reports success: a reward taken on its word alone teaches the memory that whatever it followed worked.
The environment often knows better: the tests it ran, its build, its type checker, and the user's next words. So a
recall gathers **checks** while its task goes on (:class:`~memrl_mcp.validation.Check`: a test run, a build, a type
check, a lint, a project's own check, each passed or failed; an edit of the files; the user's verdict) and its
reward is decided by the strongest source that spoke (:func:`decide`):

1. **The user**, whose last word wins: they see what no check does.
2. **The checks that ran after the last edit** (an earlier run tested other code): the latest run of each command
   counts; any of them failing makes the task a failure, and one passing test run, build or project check with none
   failing a success (a type check or a lint passing alone proves nothing works).
3. **The model's own judgement** (its report's ``reward``), only where neither spoke; it moves utility less: its
   update's rate is ``alpha * model_reward_weight``.

The reward is then the scale's (``reward_max`` for a success, ``reward_min`` for a failure) and carries its source;
a model's claim that the evidence contradicts is kept beside it (``claimed``) and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memrl_mcp.models import RewardSource
from memrl_mcp.rewards import RewardScale
from memrl_mcp.validation import Check

PROVES_SUCCESS = frozenset({"tests", "build", "check"})
"""The checks whose passing run says the task works (a clean type check or lint says only that nothing is flagged)."""


@dataclass(frozen=True)
class Verdict:
    """What the evidence says of a task: succeeded or not, and which source said it."""

    succeeded: bool
    source: RewardSource


@dataclass(frozen=True)
class Decision:
    """A recall's reward as decided: the reward, its source, the weight its update's rate gets, and the model's
    claim when the evidence or the user overruled it (None: it agreed, or there was none)."""

    reward: float
    source: RewardSource
    weight: float = 1.0
    claimed: float | None = None

    @property
    def contradicted(self) -> bool:
        """The model claimed the other outcome than the one decided."""
        return self.claimed is not None


def verdict(checks: Sequence[Check]) -> Verdict | None:
    """What ``checks`` say, in the order they were recorded (module docstring: the user first, then the checks
    after the last edit); None when they say nothing clear."""
    said = [check for check in checks if check.kind == "user" and check.passed is not None]
    if said:
        return Verdict(bool(said[-1].passed), "user")
    last_edit = max((i for i, check in enumerate(checks) if check.kind == "edit"), default=-1)
    latest: dict[str, Check] = {}
    for check in checks[last_edit + 1 :]:
        if check.kind not in ("edit", "user") and check.passed is not None:
            latest[check.command or check.kind] = check
    failed = [check for check in latest.values() if not check.passed]
    if failed:
        return Verdict(False, _source(failed[0]))
    proof = next((check for check in latest.values() if check.kind in PROVES_SUCCESS), None)
    return None if proof is None else Verdict(True, _source(proof))


def _source(check: Check) -> RewardSource:
    """The source a run of a check is (never an edit: an edit decides nothing)."""
    kind = check.kind
    assert kind != "edit", "an edit is no run of a check"
    return kind


def decide(checks: Sequence[Check], claim: float | None, scale: RewardScale, model_weight: float) -> Decision | None:
    """The recall's reward (module docstring); None when neither the evidence, the user nor the model gave one."""
    found = verdict(checks)
    if found is None:
        return None if claim is None else Decision(claim, "agent", model_weight)
    reward = scale.high if found.succeeded else scale.low
    disagrees = claim is not None and claim != scale.neutral and (claim > scale.neutral) != found.succeeded
    return Decision(reward, found.source, 1.0, claim if disagrees else None)
