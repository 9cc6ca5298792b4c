"""The controlled benchmark: an LLM-free experiment in which a memory's usefulness is hidden from
similarity (and from its success label), so that only learned utility, MemRL's Q, can tell.

For CI and for understanding what the learning rule does; not a substitute for the real
benchmarks. Tasks, checker and agent are a few lines of code each and a run takes seconds; only
the memory is real (the memrl-mcp server, its MiniLM embedder, its merge rule).

The world
---------
Requests to a maintenance desk: "The caretaker says the dishwasher in the staff kitchen leaves the
plates dirty since Monday." A *family* is one appliance with one symptom (8 families by default,
8 tasks each: 64 tasks). Each family has one hidden *correct* procedure among ``procedures`` (12)
named ones ("clean the filter", "descale", ...) and ``decoys`` (2) hidden *decoy* procedures,
quick fixes that only seem to work. The benchmark ``seed`` draws them and the task wording.

- Checker (the reward, +1 / -1): the correct procedure succeeds (fails with probability
  ``slip``, default 0); a decoy succeeds by luck with probability ``decoy_luck`` (0.4); anything
  else fails. A lucky decoy is a *misleading success*: stored with outcome "success", it reads
  exactly like a real one (``procedure "descale": ...``), and its task text is as similar as any.
  Only its record tells: it fails 60% of the times it is followed.
- Twins: the two families of one appliance are written alike, slot for slot (template, place,
  person, time), and differ in the symptom only ("leaves the plates dirty" / "... wet"). Their
  correct procedures differ, and neither twin's fix works for the other. Family and twin tasks
  fill a task's recall pool: its most similar family member is at MiniLM cosine 0.60-0.93, its
  most similar twin at 0.46-0.96 (dishwasher twins are near-identical, fridge twins far apart),
  and for 20-35% of tasks the twin is the nearest of all. Its most similar task of another
  appliance is at 0.43 on average (0.65 at most). ``twins=False`` (an ablation) gives the second
  family of each appliance its own wording.

The agent (scripted; deterministic given the episode's ``rng``), memories best first:

1. avoid every procedure named in an injected failure memory ("mistakes to avoid");
2. follow the procedure of the best-ranked injected success memory not avoided ("examples");
3. else guess uniformly among the procedures not avoided (among all, if none is left).

Its experience, written here (``Episode.experience``): ``procedure "<name>": <steps>.`` on
success, ``reflection: procedure "<name>" failed on this task; ...`` on failure.

Why the modes separate
----------------------
- ``none`` guesses: success about (1 + decoys * decoy_luck) / procedures = 0.15, flat.
- ``rag`` (similarity only) always shows a task's own success and failure memories (cosine 1.0;
  the merge rule keeps one of each per task, with the newest text) plus its one nearest neighbour.
  A task whose first success was a real fix stays solved. One whose first success was a lucky
  decoy follows it, fails, and its reflection then forbids the decoy; with the one neighbour shown
  being a failure or a twin's fix, it guesses or follows the twin, fails, and the newest
  reflection forbids that instead, so the decoy is back... The family memories that would work
  are never shown: in the last two epochs RAG follows a family member's memory in ~1% of
  episodes and guesses in ~28%.
- ``memrl`` (similarity and Q): memories followed into failures lose Q (lucky decoys, twins'
  fixes, reflections shown with them), memories that keep succeeding gain it, and the Phase-B
  re-ranking of the k1 = 5 candidates puts a less similar but proven family memory among the
  k2 = 3 shown, and the agent follows it (docs/harness.md has how often, and how often that succeeds).

Results (success per epoch, CSR, the baselines, transfer): docs/harness.md, "The controlled benchmark", and
docs/evaluation.md.

Options (``--option KEY=VALUE``): :class:`ControlledOptions` (``memrl-harness options controlled``).
``paraphrase=true`` words every task differently (``PARAPHRASE_TEMPLATES``, ``SYMPTOM_PARAPHRASES``), keeping its
id, family and hidden fixes: a transfer's held-out tasks as a user would phrase them (``--held-out 0.25
--eval-option paraphrase=true``). ``agent=llm`` lets the LLM choose the procedure from the request and the memories,
and the runner have it write the experience: the same world, played by a real model.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl_harness.benchmarks.base import Episode, Memory, Task, as_test_run
from memrl_harness.benchmarks.options import BenchmarkOptions
from memrl_harness.llm import LLM

PROCEDURES: Mapping[str, tuple[str, ...]] = {
    "power cycle": ("switch the unit off at the wall", "wait two minutes", "switch it back on", "run a test cycle"),
    "factory reset": ("hold the reset button for ten seconds", "wait for the lights to blink", "re-enter the settings"),
    "clean the filter": ("open the service hatch", "take out the filter", "rinse it under warm water", "refit it"),
    "recalibrate the sensor": ("open the service menu", "choose sensor calibration", "follow the prompts", "save"),
    "reseat the cables": ("unplug the unit", "unplug and replug each internal connector", "plug it back in"),
    "update the firmware": ("connect the unit to the network", "install the latest firmware", "restart the unit"),
    "replace the fuse": ("unplug the unit", "open the plug", "swap the fuse for a new one of the same rating"),
    "descale": ("fill the tank with descaler", "run an empty hot cycle", "rinse twice with clean water"),
    "bleed the air": ("turn the supply off", "open the bleed valve until water runs", "close it and top up"),
    "level the feet": ("pull the unit out", "turn each foot until the spirit level is centred", "push it back"),
    "replace the belt": ("remove the back panel", "fit a new drive belt over the pulleys", "refit the panel"),
    "clear the drain": ("disconnect the drain hose", "flush out the blockage", "reconnect the hose and test"),
}

# Each appliance gives two twin families: same wording, another symptom (and another fix).
APPLIANCES: tuple[tuple[str, tuple[str, str], tuple[str, str]], ...] = (
    ("dishwasher", ("dirty", "leaves the plates dirty"), ("wet", "leaves the plates wet")),
    ("fridge", ("warm", "does not keep the food cold"), ("humming", "hums loudly all night")),
    ("washing machine", ("drain", "does not drain the water"), ("spin", "does not spin the laundry")),
    ("printer", ("blank", "prints blank pages"), ("jam", "keeps jamming the paper")),
    ("wifi router", ("drops", "keeps dropping the connection"), ("slow", "is very slow")),
    ("boiler", ("cold", "gives no hot water"), ("pressure", "keeps losing pressure")),
    ("coffee machine", ("weak", "makes weak coffee"), ("leak", "leaks water on the counter")),
    ("air conditioner", ("warm-air", "blows warm air"), ("drip", "drips water on the floor")),
)

TEMPLATES = (
    "The {appliance} in the {place} {symptom} {when}.",
    "{who} reports that the {appliance} in the {place} {symptom} {when}.",
    "Please fix the {appliance} in the {place}: it {symptom} {when}.",
    "{who} says the {place} {appliance} {symptom} {when}.",
    "Since {since}, the {appliance} in the {place} {symptom}.",
)
# ``paraphrase=true``: the same tasks (ids, families, hidden fixes) in other words, for the transfer setting
# (memory built on some tasks, evaluated on held-out ones written differently). Template i rewords template i.
PARAPHRASE_TEMPLATES = (
    "Could someone look at the {appliance} in the {place}? It {symptom} {when}.",
    "{who} tells us that in the {place} the {appliance} {symptom} {when}.",
    "Repair needed in the {place}: the {appliance} {symptom} {when}.",
    "{who} complains the {appliance} of the {place} {symptom} {when}.",
    "Ever since {since}, the {place} {appliance} {symptom}.",
)
SYMPTOM_PARAPHRASES = {
    "leaves the plates dirty": "washes the dishes badly, they come out grimy",
    "leaves the plates wet": "finishes with the dishes still damp",
    "does not keep the food cold": "lets the groceries get warm",
    "hums loudly all night": "makes a loud buzzing noise at night",
    "does not drain the water": "stays full of water after the wash",
    "does not spin the laundry": "leaves the clothes soaking because the drum will not turn",
    "prints blank pages": "puts out empty sheets",
    "keeps jamming the paper": "gets sheets stuck inside again and again",
    "keeps dropping the connection": "loses the internet every few minutes",
    "is very slow": "gives a sluggish connection",
    "gives no hot water": "only delivers cold water",
    "keeps losing pressure": "shows the pressure falling again and again",
    "makes weak coffee": "brews coffee that tastes watery",
    "leaks water on the counter": "leaves puddles on the worktop",
    "blows warm air": "does not cool the room at all",
    "drips water on the floor": "leaves a wet patch on the floor below it",
}
PLACES = (
    "staff kitchen",
    "second-floor flat",
    "basement canteen",
    "guest house",
    "school staff room",
    "corner office",
    "holiday cottage",
    "day-care centre",
    "dental surgery",
    "student residence",
    "village hall",
    "night shelter",
)
PEOPLE = ("Maria", "A tenant", "The caretaker", "Our night nurse", "The manager", "Mr Okafor", "A guest", "Lena")
TIMES = (  # (as a trailing phrase, after "Since")
    ("since Monday", "Monday"),
    ("after the power cut", "the power cut"),
    ("every evening", "last week"),
    ("since the move", "the move"),
    ("after the holidays", "the holidays"),
    ("since the storm", "the storm"),
    ("this morning", "this morning"),
    ("after the last service", "the last service"),
)

_NAMED = re.compile(r'procedure "([^"]+)"')


def success_experience(procedure: str) -> str:
    """What a success teaches: the procedure, as a short script."""
    return f'procedure "{procedure}": {"; ".join(PROCEDURES[procedure])}.'


def failure_experience(procedure: str) -> str:
    """What a failure teaches: the procedure that failed, to avoid."""
    return f'reflection: procedure "{procedure}" failed on this task; avoid it here and try a different procedure.'


def named_procedure(experience: str, known: Collection[str] = PROCEDURES.keys()) -> str | None:
    """The procedure an experience names (None when it names none of the ``known`` ones)."""
    match = _NAMED.search(experience)
    return match.group(1) if match and match.group(1) in known else None


@dataclass(frozen=True)
class Choice:
    """What the agent does: a procedure, the memory it followed (None: a guess), what it avoided."""

    procedure: str
    followed: str | None
    avoided: tuple[str, ...]


def choose(memories: Sequence[Memory], procedures: Sequence[str], rng: random.Random) -> Choice:
    """The scripted agent: avoid what injected failures name, follow the best-ranked success not
    avoided, else guess among the procedures not avoided (among all, if none is left). An experience that names
    none of ``procedures`` (another kind of task's) is passed over."""
    avoided = {p for m in memories if m.outcome == "failure" and (p := named_procedure(m.experience, procedures))}
    for memory in memories:
        procedure = named_procedure(memory.experience, procedures) if memory.outcome == "success" else None
        if procedure is not None and procedure not in avoided:
            return Choice(procedure, memory.id, tuple(sorted(avoided)))
    options = [p for p in procedures if p not in avoided] or list(procedures)
    return Choice(rng.choice(options), None, tuple(sorted(avoided)))


class ControlledOptions(BenchmarkOptions):
    """The controlled benchmark's options; the module docstring says what each does to the experiment."""

    families: int = Field(
        8, ge=2, le=2 * len(APPLIANCES), description="families of tasks (an appliance and a symptom each; twins)"
    )
    tasks_per_family: int = Field(8, ge=1, le=len(PLACES), description="tasks per family, each in a place of its own")
    procedures: int = Field(12, ge=3, le=len(PROCEDURES), description="the procedures an agent chooses among")
    decoys: int = Field(2, ge=0, description="decoy procedures per family, succeeding by luck (at most procedures - 2)")
    decoy_luck: float = Field(0.4, ge=0, le=1, description="probability that a decoy succeeds")
    slip: float = Field(0.0, ge=0, le=1, description="probability that the correct procedure fails")
    twins: bool = Field(True, description="the two families of an appliance worded alike (false: an ablation)")
    seed: int = Field(0, description="draws the world; the runner's seed orders the epochs and rolls the episodes")
    agent: Literal["script", "llm"] = Field("script", description="who chooses the procedure: the script or the LLM")
    paraphrase: bool = Field(False, description="the same tasks in other words (a transfer's held-out tasks)")

    @model_validator(mode="after")
    def _a_fix_and_a_twin_fix_are_no_decoys(self) -> ControlledOptions:
        if self.decoys > self.procedures - 2:
            raise ValueError(f"decoys: must be at most procedures - 2 = {self.procedures - 2}, got {self.decoys}")
        return self


class ControlledBenchmark:
    """Maintenance requests with hidden fixes; see the module docstring for the experiment."""

    name = "controlled"
    Options = ControlledOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`ControlledOptions`, as text (``--option families=4``) or typed."""
        options = self.options = ControlledOptions.parse(self.name, values)
        self.needs_llm = options.agent == "llm"
        templates = PARAPHRASE_TEMPLATES if options.paraphrase else TEMPLATES
        self.procedures = tuple(PROCEDURES)[: options.procedures]
        draw = random.Random(f"controlled:{options.seed}")
        self._tasks: list[Task] = []
        for pair in range((options.families + 1) // 2):
            appliance, *symptoms = APPLIANCES[pair]
            sides = min(2, options.families - 2 * pair)
            fixes = draw.sample(self.procedures, 2)  # the twins' correct procedures differ
            slots = self._slots(draw, options.tasks_per_family)
            for side in range(sides):
                if side and not options.twins:
                    slots = self._slots(draw, options.tasks_per_family)
                key, symptom = symptoms[side]
                family = f"{appliance} {key}"
                wrong = [p for p in self.procedures if p not in fixes]
                decoy_set = tuple(draw.sample(wrong, min(options.decoys, len(wrong))))
                for i, (template, place, who, when) in enumerate(slots):
                    text = templates[template].format(
                        appliance=appliance,
                        place=place,
                        who=who,
                        symptom=SYMPTOM_PARAPHRASES[symptom] if options.paraphrase else symptom,
                        when=when[0],
                        since=when[1],
                    )
                    self._tasks.append(
                        Task(
                            id=f"{family.replace(' ', '-')}-{i}",
                            intent=text[0].upper() + text[1:],
                            data={"family": family, "procedure": fixes[side], "decoys": decoy_set},
                            type=family,
                        )
                    )

    @staticmethod
    def _slots(draw: random.Random, count: int) -> list[tuple[int, str, str, tuple[str, str]]]:
        """Wording of one family's tasks: a distinct place each (so no two texts are near-twins)."""
        places = draw.sample(PLACES, count)
        return [(draw.randrange(len(TEMPLATES)), place, draw.choice(PEOPLE), draw.choice(TIMES)) for place in places]

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def check(self, task: Task, procedure: str, rng: random.Random) -> bool:
        """The checker: correct succeeds (but for ``slip``), a decoy by luck, anything else fails."""
        roll = rng.random()
        if procedure == task.data["procedure"]:
            return roll >= self.options.slip
        if procedure in task.data["decoys"]:
            return roll < self.options.decoy_luck
        return False

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        if llm is not None:
            return self._llm_episode(task, memories, llm, rng)
        choice = choose(memories, self.procedures, rng)
        success = self.check(task, choice.procedure, rng)
        how = f"followed memory {choice.followed}" if choice.followed else "guessed"
        avoided = ", ".join(choice.avoided) or "nothing"
        trajectory = (
            f"{len(memories)} memories; avoided: {avoided}; {how}: {choice.procedure}; "
            f"steps: {'; '.join(PROCEDURES[choice.procedure])}; checker: {'success' if success else 'failure'}"
        )
        worked, failed = success_experience(choice.procedure), failure_experience(choice.procedure)
        return Episode(
            success=success,
            reward=1.0 if success else -1.0,
            steps=len(PROCEDURES[choice.procedure]),
            trajectory=trajectory,
            experience=worked if success else failed,
            mistaken_experience=failed if success else worked,
            check=as_test_run(success, f"test_request.py::test_the_{task.data['family'].replace(' ', '_')}_is_fixed"),
        )

    def _llm_episode(self, task: Task, memories: Sequence[Memory], llm: LLM, rng: random.Random) -> Episode:
        """The LLM picks one procedure (a JSON answer constrained to the names); the checker judges it."""
        follow = [m.experience for m in memories if m.outcome == "success"]
        avoid = [m.experience for m in memories if m.outcome == "failure"]
        prompt = (
            f"Maintenance request: {task.intent}\n\n"
            + (
                "Examples that worked on similar requests (follow them):\n- " + "\n- ".join(follow) + "\n\n"
                if follow
                else ""
            )
            + ("Mistakes on similar requests (avoid them):\n- " + "\n- ".join(avoid) + "\n\n" if avoid else "")
            + "Which procedure fixes it? Answer with one of: "
            + ", ".join(self.procedures)
            + "."
        )
        schema = {
            "type": "object",
            "properties": {"procedure": {"type": "string", "enum": list(self.procedures)}},
            "required": ["procedure"],
        }
        reply = llm.chat([{"role": "user", "content": prompt}], json_schema=schema, max_tokens=32)
        procedure = reply.data["procedure"]
        success = self.check(task, procedure, rng)
        return Episode(
            success=success,
            reward=1.0 if success else -1.0,
            steps=1,
            trajectory=f"{prompt}\nchose: {procedure}\nchecker: {'success' if success else 'failure'}",
            usage=reply.usage,
        )
