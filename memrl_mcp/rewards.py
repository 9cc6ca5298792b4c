"""The reward scale as the model is told it, in one wording wherever it is told: the server's instructions and its
``memory_loop`` prompt, a refusal that asks for a reward, and the hold of a stop; the tools' argument descriptions
name its numbers. The scale is the settings' (``reward_max`` a success, ``reward_min`` a failure, their middle no
clear outcome). The standard library only: the hooks tell it too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardScale:
    """The rewards of a success (``high``), a failure (``low``) and no clear outcome (their middle)."""

    low: float
    high: float

    @property
    def neutral(self) -> float:
        return (self.low + self.high) / 2

    def __str__(self) -> str:
        return f"{self.high:g} success, {self.low:g} failure, {self.neutral:g} no clear outcome"
