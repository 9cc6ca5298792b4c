"""Step-memory fixtures: a task and its trajectories, real or synthetic, and the step records a service holds."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from memrl_mcp.memory.service import MemoryService
from memrl_mcp.validation import TrajectoryStep

MUG = "put a clean mug in the coffee machine"
ROOM = "You are in the middle of a room. Looking around you, you see a countertop 1, a sinkbasin 1, a coffeemachine 1."
COUNTER = "On the countertop 1, you see a mug 1 and a knife 1."
HOLDING = "You pick up the mug 1 from the countertop 1."


def trajectory_of(*steps: tuple[str, str, float]) -> list[dict[str, Any]]:
    return [{"observation": o, "action": a, "reward": r} for o, a, r in steps]


def steps_of(steps: Sequence[Mapping[str, Any]]) -> list[TrajectoryStep]:
    """Steps written as a tool takes them (JSON objects), as the Python API takes them."""
    return [TrajectoryStep.model_validate(step) for step in steps]


SUCCESS = trajectory_of(
    (ROOM, "go to countertop 1", 0.0),
    (COUNTER, "take mug 1 from countertop 1", 0.0),
    (HOLDING, "go to sinkbasin 1", 1.0),
)


def records(service: MemoryService) -> dict[str, Any]:
    """Every step record of the store, by id, as plain data."""
    return {r.id: r.model_dump() for r in service.step_records()}


PLACES = ["countertop", "cabinet", "drawer", "fridge", "sinkbasin", "microwave", "shelf", "diningtable", "desk"]
THINGS = ["mug", "cup", "knife", "apple", "bread", "lettuce", "tomato", "egg", "pan", "pot", "plate", "bowl", "key"]
NAMES = ["rows", "cols", "total", "mean", "path", "data", "items", "value", "result", "users", "orders", "prices"]


def observation(rng: random.Random, chars: int) -> str:
    """A room description (ALFWorld's style) of about ``chars`` characters."""
    place = rng.choice(PLACES)
    text = f"You arrive at {place} {rng.randrange(1, 9)}. On the {place} {rng.randrange(1, 9)}, you see"
    while len(text) < chars:
        text += f" a {rng.choice(THINGS)} {rng.randrange(1, 9)},"
    return text[:chars]


def action(rng: random.Random, chars: int) -> str:
    """A shell command running a Python one-liner of about ``chars`` characters."""
    text = f"python3 -c \"import csv, json; rows = list(csv.reader(open('/data/{rng.choice(NAMES)}.csv')))"
    while len(text) < chars:
        a, b = rng.choice(NAMES), rng.choice(NAMES)
        text += f"; {a} = [r[{rng.randrange(9)}] for r in rows if r[{rng.randrange(9)}] != '{b}']"
    return text[:chars]


def synthetic_trajectory(seed: int, steps: int, observation_chars: int, action_chars: int) -> list[dict[str, Any]]:
    """The issue's shape: distinct observations (each its own record), rewards 0 but the last."""
    rng = random.Random(seed)
    return [
        {
            "observation": f"[{seed}.{t}] {observation(rng, observation_chars - len(f'[{seed}.{t}] '))}",
            "action": action(rng, action_chars),
            "reward": float(t == steps - 1),
        }
        for t in range(steps)
    ]
