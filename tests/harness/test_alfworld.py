"""The ALFWorld benchmark on the shared games: task list, planner oracle, a do-nothing agent, a run.

Needs the ``alfworld`` extra (alfworld 0.4.2 + TextWorld) and the shared data; skipped without them.
"""

import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks import load_benchmark
from memrl_harness.benchmarks.alfworld import AlfworldBenchmark, Game, Policy, task_type
from memrl_harness.llm import LLM, Usage
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest

pytestmark = pytest.mark.slow  # needs ALFWorld: `make test` runs it, `make test-fast` does not

# Small bedroom games (fast to reset), one per type where the split has one.
FAST = (
    "look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T20190909_044715_250790",
    "pick_and_place_simple-Pencil-None-Desk-310/trial_T20190909_113054_894334",
    "pick_two_obj_and_place-CD-None-Drawer-304",
)


@pytest.fixture(scope="module")
def bench() -> AlfworldBenchmark:
    return AlfworldBenchmark(max_steps=12)


@pytest.fixture(scope="module")
def fast_tasks(bench: AlfworldBenchmark):
    return [next(t for t in bench.tasks() if t.id.startswith(prefix)) for prefix in FAST]


@pytest.fixture(scope="module")
def plans(fast_tasks) -> dict[str, list[str]]:
    """The fast-downward planner's plan for each fast game, from its start."""
    out = {}
    for task in fast_tasks:
        with Game(task.data["game_file"], policy=True) as game:
            out[task.intent] = game.reset().policy
    return out


def test_task_types_from_folder_names():
    assert task_type("pick_and_place_simple-Pencil-None-Desk-310") == "put"
    assert task_type("look_at_obj_in_light-Bowl-None-DeskLamp-301") == "examine"
    assert task_type("pick_clean_then_place_in_recep-Ladle-None-CounterTop-8") == "clean"
    assert task_type("pick_heat_then_place_in_recep-Tomato-None-DiningTable-7") == "heat"
    assert task_type("pick_cool_then_place_in_recep-Plate-None-Cabinet-27") == "cool"
    assert task_type("pick_two_obj_and_place-CD-None-Drawer-304") == "puttwo"
    assert task_type("something_else-X") is None


def test_task_lists_of_the_splits(bench: AlfworldBenchmark, tmp_path: Path):
    tasks = bench.tasks()
    assert len(tasks) == 140 and len({t.id for t in tasks}) == 140
    assert Counter(t.type for t in tasks) == {
        "put": 35,
        "clean": 27,
        "cool": 25,
        "puttwo": 24,
        "heat": 16,
        "examine": 13,
    }
    pencil = next(t for t in tasks if t.id.startswith(FAST[1]))
    assert pencil.intent == "put some pencil on desk." and pencil.type == "put"
    assert all(t.intent.endswith(".") and Path(t.data["game_file"]).is_file() for t in tasks)
    assert len(load_benchmark("alfworld", split="valid_train", limit="5").tasks()) == 5
    with pytest.raises(ValueError, match="split"):
        AlfworldBenchmark(split="train")
    # games=PATH: any folder laid out like a split
    source = Path(pencil.data["game_file"]).parent
    shutil.copytree(source, tmp_path / source.parent.name / source.name)
    (only,) = AlfworldBenchmark(games=tmp_path).tasks()
    assert (only.id, only.intent, only.type) == (pencil.id, pencil.intent, "put")


def replaying(plan: list[str]) -> Policy:
    """A policy that plays ``plan``, an action a step."""
    return lambda room, state, past, advice: ("", plan[len(past)], Usage())


def test_replaying_the_planner_wins(bench: AlfworldBenchmark, fast_tasks, plans):
    for task in fast_tasks:
        plan = plans[task.intent]
        assert 0 < len(plan) <= bench.options.max_steps
        episode = bench.play(task, replaying(plan))
        assert (episode.success, episode.reward, episode.steps) == (True, 1.0, len(plan)), task.id
        assert episode.trajectory.startswith(f"Task: {task.intent}") and "goal reached" in episode.trajectory


def test_an_agent_that_only_looks_never_wins(fake_llm: FakeLLMServer, llm: LLM, fast_tasks):
    bench = AlfworldBenchmark(max_steps=4)
    fake_llm.responder = json.dumps({"thought": "let me look", "action": "look"})
    for task in fast_tasks[:2]:
        episode = bench.run_episode(task, [], llm, random.Random(0))
        assert (episode.success, episode.reward, episode.steps) == (False, -1.0, 4)
        assert "goal not reached after 4 steps" in episode.trajectory
    assert len(fake_llm.chat_requests) == 8
    first = fake_llm.chat_requests[0]
    assert first.response_format is not None
    enum = first.response_format["json_schema"]["schema"]["properties"]["action"]["enum"]
    assert "look" in enum and "go to desk 1" in enum
    prompt = first.last_user
    assert "Example of a solved examine task" in prompt and f"Your task is to: {fast_tasks[0].intent}" in prompt
    assert "Step 1 of 4" in prompt and "Admissible commands: " in prompt and len(prompt) < 6000
    assert "Step 4 of 4" in fake_llm.chat_requests[3].last_user


def expert(plans: dict[str, list[str]]):
    """A fake LLM that plays the planner's plan (goal and step number read from the prompt)."""

    def respond(request: RecordedRequest) -> str:
        text = request.last_user
        if request.response_format is None:  # the runner asks for an experience
            return "1. go to the object 2. take it 3. bring it to the target and use or move it there"
        goal, step = re.search(r"Your task is to: (.+)", text), re.search(r"Step (\d+) of", text)
        assert goal is not None and step is not None, text
        return json.dumps({"thought": "follow the plan", "action": plans[goal[1].strip()][int(step[1]) - 1]})

    return respond


@pytest.mark.anyio
async def test_a_memrl_run_stores_the_successes(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path, fast_tasks, plans):
    for task in fast_tasks[:2]:  # a games folder with just these two
        trial = Path(task.data["game_file"]).parent
        shutil.copytree(trial, tmp_path / "games" / trial.parent.name / trial.name)
    bench = AlfworldBenchmark(games=tmp_path / "games", max_steps=10)
    fake_llm.responder = expert(plans)
    config = RunConfig(benchmark="alfworld", mode="memrl", epochs=2, seed=1, workers=2)
    with anyio.fail_after(150):
        records = await Runner(config, bench, RunDir(tmp_path / "run"), llm).run()

    assert len(records) == 4 and all(r.success and r.checker_reward == 1.0 for r in records)
    assert {r.task_type for r in records} == {"examine", "put"}
    assert all(r.steps == len(plans[t.intent]) for r in records for t in fast_tasks if t.id == r.task_id)
    assert all(r.stored_id for r in records)
    second = [r for r in records if r.epoch == 2]
    assert all(r.memory_ids for r in second)  # epoch 1's successes are recalled in epoch 2
    prompts = [r.last_user for r in fake_llm.chat_requests if r.response_format is not None]
    assert any("Experiences that worked on similar tasks" in p and "1. go to the object" in p for p in prompts)
