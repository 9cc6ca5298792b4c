"""ALFWorld (text-only, TextWorld engine): household tasks played by a ReAct-style LLM agent.

Tasks are the games of one folder (``<folder>/<task dir>/<trial>/game.tw-pddl``): by default the
``valid_seen`` split (140 games, ALFWorld's ``eval_in_distribution``) of the shared data,
``split=valid_train`` (200 games), or any folder with ``games=PATH``. The shared data lives in
``alfworld/`` of the data folder (``memrl_harness.install.shared_data_root``); nothing is ever
downloaded. A task's intent is the game's goal ("put a clean mug in coffeemachine."), read from
the game file without starting the game; its type comes from the task folder's prefix (put,
examine, clean, heat, cool, puttwo), so the report breaks results down per type.

The episode: each step the LLM gets the type's few-shot example (``alfworld_examples.json``,
compacted), the memories (successes to follow, failure reflections to avoid), the goal, the last
``history`` steps, the step memory's advice on the current observation (the step-memory modes) and the
admissible commands, and answers ``{"thought", "action"}`` with the
action constrained to the admissible commands by the JSON schema's enum. Up to ``max_steps``
(30) steps; success is the game's ``won``; reward +1 / -1. Prompts stay small enough for a
2048-token local model: history, observations, example and memories are cut to fixed sizes.

Requirements: ``pip install alfworld==0.4.2`` with its TextWorld engine (see the
``alfworld`` extra in pyproject.toml). Each episode starts its own game: TextWorld's PDDL engine
loads a private copy of fast-downward's library per game, but its text generation shares one
module-level TatSu parser that is not thread-safe, so game creation, reset and step are
serialized by a module lock: episodes run in the runner's worker threads with their LLM calls
concurrent and their game steps one at a time (what a step and a reset cost: docs/performance.md,
"The harness and its installs"). For more game throughput, run several harness processes on disjoint
task lists. A library copy is never unloaded (ctypes cannot), so a long run's memory grows with its
episodes.

Lean install (no torch; ``pip install alfworld==0.4.2`` also works but pulls spaCy through
jericho, which only needs to be importable): fast-downward-textworld is an sdist built with
cmake and a C++ compiler that needs ``wheel`` and no build isolation::

    pip install wheel
    pip install --no-build-isolation --no-deps alfworld==0.4.2 textworld==1.7.0
    pip install --no-build-isolation --no-deps fast-downward-textworld==20.6.4 jericho==3.3.1
    pip install "tatsu==5.8.3" hashids mementos more_itertools networkx termcolor prompt_toolkit
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl_harness.benchmarks.base import (
    Episode,
    Memory,
    StepAdvice,
    Steps,
    StepwiseBenchmark,
    Task,
)
from memrl_harness.benchmarks.options import BenchmarkOptions
from memrl_harness.install import data_hint, install_hint, shared_data_root
from memrl_harness.llm import LLM, LLMFormatError, Usage

TYPES = {  # ALFWorld's task folders -> the example keys of alfworld_examples.json
    "pick_and_place_simple": "put",
    "look_at_obj_in_light": "examine",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "puttwo",
}
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
_GOAL = re.compile(r"Your task is to: ([^\"\\]+)")
_ENV_LOCK = threading.Lock()
INSTALL_HINT = install_hint("alfworld", "pip install 'memrl-mcp[alfworld]'")

# Prompt sizes (characters; about 4 per token): all together well under 2048 tokens.
EXAMPLE_CHARS = 1400
MEMORY_CHARS = 350
OBSERVATION_CHARS = 220
ROOM_CHARS = 600
TRAJECTORY_OBSERVATION_CHARS = 120

SYSTEM = (
    "You are a household robot in a text game. Reach the goal with the admissible commands. "
    'Answer JSON {"thought": "<one short sentence>", "action": "<one admissible command>"}. '
    "Commands: go to X, take X from Y, move X to Y, open X, close X, heat X with Y, cool X with Y, "
    "clean X with Y, use X, examine X, look, inventory."
)


def task_type(folder: str) -> str | None:
    """put / examine / clean / heat / cool / puttwo from a task folder name (None: not one of them)."""
    return TYPES.get(folder.split("-", 1)[0])


def game_goal(game_file: Path) -> str:
    """The goal text ("put some pencil on desk.") as the game's grammar states it."""
    data = json.loads(game_file.read_text())
    match = _GOAL.search(data.get("grammar", ""))
    if not match:
        raise ValueError(f"{game_file}: no 'Your task is to:' goal in its grammar")
    return match.group(1).strip()


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def clean_observation(feedback: str) -> str:
    return feedback.replace(WELCOME, "").strip()


@cache
def load_examples(path: Path) -> dict[str, str]:
    """Per type, the few-shot dialogue compacted to ``> action`` / observation lines."""
    examples: dict[str, str] = {}
    for item in json.loads(path.read_text()):
        lines = []
        for turn in item["example"]:
            content = turn["content"].strip()
            if turn["role"] == "assistant":
                thought, _, action = content.partition("Action:")
                thought = thought.replace("Thought:", "").strip()
                lines.append(f"think: {_cut(thought, 90)}" if thought else "")
                lines.append(f"> {action.strip()}")
            else:
                lines.append(_cut(content.replace("Observation:", "").strip(), 160))
        examples[item["task"]] = _cut_lines([line for line in lines if line], EXAMPLE_CHARS)
    return examples


def _cut_lines(lines: Sequence[str], limit: int) -> str:
    out: list[str] = []
    size = 0
    for line in lines:
        if size + len(line) + 1 > limit:
            out.append("...")
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


@dataclass
class GameState:
    observation: str
    admissible: list[str]
    won: bool
    done: bool
    policy: list[str]


class Game:
    """One ALFWorld game (a TextWorld PDDL env with ALFWorld's wrappers); ``policy=True`` also
    asks the planner for its plan at every state (slow: seconds more per reset or step)."""

    def __init__(self, game_file: Path | str, *, policy: bool = False) -> None:
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ImportError as error:
            raise ValueError(f"ALFWorld is not installed (no module {error.name}): {INSTALL_HINT}") from None

        infos = textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=policy, extras=["gamefile"])
        with _ENV_LOCK:
            self._env = textworld.start(
                str(game_file), request_infos=infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos]
            )

    def _state(self, state: Any, done: bool) -> GameState:
        return GameState(
            observation=clean_observation(state["feedback"]),
            admissible=list(state["admissible_commands"] or []),
            won=bool(state["won"]),
            done=bool(done),
            policy=list(state.get("policy_commands") or []),
        )

    def reset(self) -> GameState:
        with _ENV_LOCK:
            return self._state(self._env.reset(), False)

    def step(self, command: str) -> GameState:
        with _ENV_LOCK:
            state, _, done = self._env.step(command)
            return self._state(state, done)

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> Game:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Policy = Callable[[str, GameState, list[tuple[str, str]], StepAdvice], tuple[str, str, Usage]]


class AlfworldOptions(BenchmarkOptions):
    """ALFWorld's options."""

    split: Literal["valid_seen", "valid_train"] = Field(
        "valid_seen", description="the games of this split of the shared data (140 / 200 games)"
    )
    games: Path | None = Field(None, description="the games of this folder instead, laid out like a split")
    max_steps: int = Field(30, ge=1, description="decisions per game before it counts as lost")
    history: int = Field(6, ge=1, description="the last steps shown in each prompt")
    limit: int | None = Field(None, ge=1, description="the first N games only")
    examples: Path | None = Field(None, description="few-shot examples by task type (default: alfworld_examples.json)")


class AlfworldBenchmark(StepwiseBenchmark):
    """ALFWorld games with a ReAct-style LLM agent; see the module docstring."""

    name = "alfworld"
    needs_llm = True
    Options = AlfworldOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`AlfworldOptions`, as text (``--option max_steps=20``) or typed."""
        options = self.options = AlfworldOptions.parse(self.name, values)
        root = shared_data_root() / "alfworld"
        self.games_dir = options.games or root / options.split
        if not self.games_dir.is_dir():
            raise ValueError(data_hint("ALFWorld games folder", self.games_dir) + " (or games=PATH)")
        self.examples_file = options.examples or root / "alfworld_examples.json"
        self._tasks = self._collect(options.limit)

    def _collect(self, limit: int | None) -> list[Task]:
        tasks = []
        for game_file in sorted(self.games_dir.glob("*/*/game.tw-pddl")):
            trial, folder = game_file.parent, game_file.parent.parent
            kind = task_type(folder.name)
            if kind is None or "movable" in folder.name or "Sliced" in folder.name:
                continue  # ALFWorld skips these too
            if not json.loads(game_file.read_text()).get("solvable", False):
                continue
            tasks.append(
                Task(
                    id=f"{folder.name}/{trial.name}",
                    intent=game_goal(game_file),
                    data={"game_file": str(game_file)},
                    type=kind,
                )
            )
        if not tasks:
            raise ValueError(f"no ALFWorld games (*/*/game.tw-pddl) under {self.games_dir}")
        return tasks[:limit] if limit else tasks

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def example(self, kind: str | None) -> str:
        if not self.examples_file.is_file():
            return ""
        return load_examples(self.examples_file).get(kind or "", "")

    def prompt(
        self,
        task: Task,
        memories: Sequence[Memory],
        state: GameState,
        room: str,
        past: list[tuple[str, str]],
        advice: StepAdvice | None = None,
    ) -> str:
        """The user message of one step (the step number lets scripted test LLMs follow a plan)."""
        parts = []
        example = self.example(task.type)
        if example:
            parts.append(f"Example of a solved {task.type} task:\n{example}")
        follow = [_cut(m.experience, MEMORY_CHARS) for m in memories if m.outcome == "success"]
        avoid = [_cut(m.experience, MEMORY_CHARS) for m in memories if m.outcome == "failure"]
        if follow:
            parts.append("Experiences that worked on similar tasks (follow them):\n- " + "\n- ".join(follow))
        if avoid:
            parts.append("Mistakes on similar tasks (avoid them):\n- " + "\n- ".join(avoid))
        parts.append(f"Your task is to: {task.intent}\nRoom: {_cut(room, ROOM_CHARS)}")
        shown = past[-self.options.history :]
        if shown:
            skipped = len(past) - len(shown)
            lines = [f"({skipped} earlier steps not shown)"] if skipped else []
            lines += [f"> {a}\n{_cut(o, OBSERVATION_CHARS)}" for a, o in shown]
            parts.append("Recent steps:\n" + "\n".join(lines))
        if advice:
            parts.append(advice.section())
        admissible = ", ".join(state.admissible)
        parts.append(f"Step {len(past) + 1} of {self.options.max_steps}. Admissible commands: {admissible}")
        return "\n\n".join(parts)

    def play(self, task: Task, act: Policy, steps: Steps | None = None) -> Episode:
        """Play one game with ``act(room, state, past, advice) -> (thought, action, usage)``, asking ``steps`` for
        advice on each observation (the game's last feedback; the room and goal at the start)."""
        steps = steps or Steps()
        usage = Usage()
        past: list[tuple[str, str]] = []
        thoughts: list[str] = []
        with Game(task.data["game_file"]) as game:
            state = game.reset()
            room = state.observation.split("Your task is to:")[0].strip()
            while len(past) < self.options.max_steps and not state.done and not state.won:
                thought, action, spent = act(room, state, past, steps.advise(state.observation))
                steps.took(state.observation, action)
                usage = usage + spent
                state = game.step(action)
                past.append((action, state.observation))
                thoughts.append(thought)
        lines = [f"Task: {task.intent}", f"Start: {_cut(room, 300)}"]
        for (action, observation), thought in zip(past, thoughts, strict=True):
            if thought:
                lines.append(f"think: {_cut(thought, 100)}")
            lines.append(f"> {action}\n{_cut(observation, TRAJECTORY_OBSERVATION_CHARS)}")
        lines.append("Result: " + ("goal reached" if state.won else f"goal not reached after {len(past)} steps"))
        return Episode(
            success=state.won,
            reward=1.0 if state.won else -1.0,
            steps=len(past),
            trajectory="\n".join(lines),
            usage=usage,
        )

    def run_steps(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: Any, steps: Steps) -> Episode:
        if llm is None:
            raise ValueError("the alfworld benchmark needs an LLM")

        def act(room: str, state: GameState, past: list[tuple[str, str]], advice: StepAdvice) -> tuple[str, str, Usage]:
            schema = {
                "type": "object",
                "properties": {
                    "thought": {"type": "string", "maxLength": 300},
                    "action": {"type": "string", "enum": state.admissible},
                },
                "required": ["thought", "action"],
                "additionalProperties": False,
            }
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": self.prompt(task, memories, state, room, past, advice)},
            ]
            try:
                reply = llm.chat(messages, json_schema=schema, max_tokens=128)
            except LLMFormatError:  # no valid answer even after the retry: a wasted step
                return "", "look", Usage(calls=1)
            return str(reply.data.get("thought", "")), reply.data["action"], reply.usage

        return self.play(task, act, steps)
