"""What ``memory_stats`` reports, as counts that can be kept up to date instead of recomputed by reading every memory.

A :class:`Tally` holds, per namespace, the memories per outcome, the visits summed and a histogram of Q in steps of
:data:`Q_STEP`. Adding a memory's payload and subtracting it are exact integer operations, so a tally maintained
write by write equals the tally of a full scan, whatever the order of the writes; the Q summary read from the
histogram is exact to ``Q_STEP`` (a Q is counted in the step nearest to it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memrl_mcp.storage.numbers import finite

Q_STEP = 1e-4
MAX_COUNTED = 10**12
"""The largest count of visits and Q step a memory adds to a tally (a Q of 1e8): far beyond any reward range or
visit count a server reaches, and a million such memories still sum within 64-bit integers."""
FIELDS = ("namespace", "outcome", "q", "visits")
"""The payload fields a tally reads."""


@dataclass
class Counts:
    """One namespace's share of a tally."""

    successes: int = 0
    failures: int = 0
    visits: int = 0
    q_steps: Counter[int] = field(default_factory=Counter)

    def add(self, payload: Mapping[str, Any], sign: int) -> None:
        """Count (sign 1) or uncount (-1) a memory; a field that a damaged, hand-made or other version's point lacks,
        or holds as no finite number, counts as zero, and a number beyond :data:`MAX_COUNTED` as that bound (the sums
        stay exact, and within the 64-bit integers that the summary computes with)."""
        if payload.get("outcome") == "success":
            self.successes += sign
        else:
            self.failures += sign
        self.visits += sign * int(_bounded(payload.get("visits"), MAX_COUNTED))
        step = round(_bounded(payload.get("q"), MAX_COUNTED * Q_STEP) / Q_STEP)
        self.q_steps[step] += sign
        if not self.q_steps[step]:
            del self.q_steps[step]

    @property
    def memories(self) -> int:
        return self.successes + self.failures


class Tally:
    """Counts per namespace; ``apply`` moves a memory's contribution from its old payload to its new one."""

    def __init__(self) -> None:
        self.namespaces: dict[str, Counts] = {}

    @classmethod
    def of(cls, payloads: Iterable[Mapping[str, Any]]) -> Tally:
        tally = cls()
        for payload in payloads:
            tally.apply(None, payload)
        return tally

    def apply(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        for payload, sign in ((old, -1), (new, 1)):
            if payload is not None:
                self.namespaces.setdefault(payload["namespace"], Counts()).add(payload, sign)
                if not self.namespaces[payload["namespace"]].memories:
                    del self.namespaces[payload["namespace"]]

    def total(self, namespaces: Iterable[str] | None = None) -> Counts:
        """The counts of ``namespaces`` (None: all) added up."""
        chosen = (
            self.namespaces
            if namespaces is None
            else {n: self.namespaces[n] for n in namespaces if n in self.namespaces}
        )
        total = Counts()
        for counts in chosen.values():
            total.successes += counts.successes
            total.failures += counts.failures
            total.visits += counts.visits
            total.q_steps.update(counts.q_steps)
        return total

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per namespace [successes, failures, visits, [[q step, count], ...]]."""
        return {
            namespace: [c.successes, c.failures, c.visits, sorted(c.q_steps.items())]
            for namespace, c in self.namespaces.items()
        }

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> Tally:
        tally = cls()
        for namespace, (successes, failures, visits, steps) in saved.items():
            tally.namespaces[namespace] = Counts(
                successes, failures, visits, Counter({int(s): int(n) for s, n in steps})
            )
        return tally


def _bounded(value: Any, bound: float) -> float:
    if (type(value) is float or type(value) is int) and -bound <= value <= bound:
        return value  # what every write of this server stores: no conversion on the write path
    number = finite(value) or 0.0
    return min(max(number, -bound), bound)
