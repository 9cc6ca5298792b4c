"""The controlled benchmark: its world is fixed by its seed, its checker and scripted agent do what
the design says, and, run through the real memory service with the runner's protocol, the three
modes come out in the order the design predicts: MemRL above RAG above no memory."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from memrl_harness.benchmarks.base import Memory
from memrl_harness.benchmarks.controlled import (
    PROCEDURES,
    ControlledBenchmark,
    choose,
    failure_experience,
    named_procedure,
    success_experience,
)
from memrl_harness.benchmarks.options import OptionError
from memrl_mcp.embeddings import Embedder, SimilarityProfile
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.validation import Outcome
from tests.support.mcp import make_service

# The paper's ALFWorld constants (configs/alfworld.yaml), spelled out so the experiment does not move
# when a default does.
MEMORY_SETTINGS = {
    "k1": 5,
    "k2": 3,
    "q_weight": 0.5,
    "alpha": 0.3,
    "q_init_success": 0.0,
    "q_init_failure": 0.0,
    "reward_min": -1.0,
    "reward_max": 1.0,
    "epsilon": 0.0,
}


def memory(procedure: str, outcome: Outcome = "success", memory_id: str | None = None) -> Memory:
    experience = success_experience(procedure) if outcome == "success" else failure_experience(procedure)
    return Memory(memory_id or f"{outcome}:{procedure}", "some task", experience, outcome, 0.0, 0.8)


# -- the world ------------------------------------------------------------------------------------


def test_tasks_are_fixed_by_the_seed() -> None:
    first, again, other = ControlledBenchmark(), ControlledBenchmark(), ControlledBenchmark(seed=1)
    assert first.tasks() == again.tasks()
    assert [t.data for t in first.tasks()] != [t.data for t in other.tasks()]
    tasks = first.tasks()
    assert len(tasks) == 8 * 8
    assert len({t.id for t in tasks}) == len(tasks)
    assert len({t.intent for t in tasks}) == len(tasks)
    assert tasks[0].intent[0].isupper() and tasks[0].intent.endswith(".")
    assert len({t.type for t in tasks}) == 8


def test_hidden_procedures_per_family() -> None:
    tasks = ControlledBenchmark(decoys=2).tasks()
    by_family: dict[str, set[tuple[str, tuple[str, ...]]]] = {}
    for task in tasks:
        by_family.setdefault(task.data["family"], set()).add((task.data["procedure"], task.data["decoys"]))
    assert all(len(hidden) == 1 for hidden in by_family.values())  # one fix, one decoy set per family
    for family, ((fix, decoys),) in by_family.items():
        assert len(decoys) == 2 and fix not in decoys, family
    # Twins (same appliance) need different fixes, and neither twin's fix works for the other.
    for twin_a, twin_b in zip(list(by_family)[::2], list(by_family)[1::2], strict=True):
        ((fix_a, decoys_a),), ((fix_b, decoys_b),) = by_family[twin_a], by_family[twin_b]
        assert fix_a != fix_b and fix_b not in decoys_a and fix_a not in decoys_b


def test_twin_tasks_differ_only_in_the_symptom() -> None:
    tasks = ControlledBenchmark(families=2, tasks_per_family=4).tasks()
    first, second = tasks[:4], tasks[4:]
    for a, b in zip(first, second, strict=True):
        assert a.data["family"] != b.data["family"] and a.data["procedure"] != b.data["procedure"]
        assert a.intent.replace("leaves the plates dirty", "leaves the plates wet") == b.intent
    apart = ControlledBenchmark(families=2, tasks_per_family=4, twins=False).tasks()
    assert [t.intent.replace("dirty", "wet") for t in apart[:4]] != [t.intent for t in apart[4:]]


@pytest.mark.parametrize(
    "options",
    [
        {"families": 1},
        {"families": 17},
        {"tasks_per_family": 0},
        {"procedures": 13},
        {"decoys": 11},
        {"slip": 1.5},
        {"decoy_luck": "often"},
        {"decoy_luck": "nan"},
        {"twins": "maybe"},
        {"families": "four"},
        {"seed": 1.5},
    ],
)
def test_options_are_checked(options: dict[str, object]) -> None:
    (name,) = options
    with pytest.raises(OptionError, match=f"^controlled: {name}: must "):
        ControlledBenchmark(**options)


def test_options_as_text() -> None:
    """The harness CLI passes ``--option KEY=VALUE`` values as text."""
    as_text = ControlledBenchmark(families="4", tasks_per_family="3", decoy_luck="0.5", twins="false", seed="2")
    typed = ControlledBenchmark(families=4, tasks_per_family=3, decoy_luck=0.5, twins=False, seed=2)
    assert as_text.tasks() == typed.tasks() and as_text.options.decoy_luck == 0.5


def test_similarity_hides_usefulness(embedder: Embedder) -> None:
    """Every task's nearest other task is of its appliance, and for a good share of tasks it is its
    twin (whose fix is wrong here) rather than one of its own family; other appliances stay further
    away; no two tasks are near-duplicates (each keeps memories of its own)."""
    tasks = ControlledBenchmark().tasks()
    vectors = embedder.embed([t.intent for t in tasks])
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -1.0)
    profile: SimilarityProfile = embedder.similarity
    assert sims.max() < profile.merge
    appliance = [t.data["family"].rsplit(" ", 1)[0] for t in tasks]
    family = [t.data["family"] for t in tasks]
    twin_first, cross = 0, []
    for i in range(len(tasks)):
        nearest = int(np.argmax(sims[i]))
        assert appliance[nearest] == appliance[i]
        twin_first += family[nearest] != family[i]
        cross.append(max(sims[i, j] for j in range(len(tasks)) if appliance[j] != appliance[i]))
    assert twin_first >= len(tasks) // 5
    assert np.mean(cross) < profile.delta and max(cross) < 0.7


# -- checker and agent ----------------------------------------------------------------------------


def test_checker() -> None:
    bench = ControlledBenchmark(decoy_luck=0.4)
    task = bench.tasks()[0]
    fix, decoys = task.data["procedure"], task.data["decoys"]
    never = next(p for p in bench.procedures if p != fix and p not in decoys)
    rolls = [random.Random(i) for i in range(2000)]
    assert all(bench.check(task, fix, rng) for rng in rolls)
    assert not any(bench.check(task, never, random.Random(i)) for i in range(2000))
    lucky = sum(bench.check(task, decoys[0], random.Random(i)) for i in range(2000)) / 2000
    assert 0.36 < lucky < 0.44
    slipping = ControlledBenchmark(slip=0.25)
    slips = sum(not slipping.check(task, fix, random.Random(i)) for i in range(2000)) / 2000
    assert 0.21 < slips < 0.29


def test_experiences_name_their_procedure() -> None:
    for procedure in PROCEDURES:
        assert named_procedure(success_experience(procedure)) == procedure
        assert named_procedure(failure_experience(procedure)) == procedure
    assert named_procedure("something else entirely") is None
    assert named_procedure('procedure "unknown trick": do it') is None


def test_agent_follows_the_best_ranked_success() -> None:
    rng = random.Random(0)
    memories = [memory("descale"), memory("power cycle"), memory("clean the filter", "failure")]
    choice = choose(memories, tuple(PROCEDURES), rng)
    assert (choice.procedure, choice.followed, choice.avoided) == ("descale", "success:descale", ("clean the filter",))
    assert choose(list(reversed(memories)), tuple(PROCEDURES), rng).procedure == "power cycle"


def test_agent_avoids_what_failures_name() -> None:
    memories = [memory("descale"), memory("descale", "failure"), memory("power cycle")]
    assert choose(memories, tuple(PROCEDURES), random.Random(0)).procedure == "power cycle"


def test_agent_guesses_among_what_is_not_avoided() -> None:
    procedures = ("descale", "power cycle", "factory reset")
    memories = [memory("descale", "failure"), memory("descale"), memory("power cycle", "failure")]
    for seed in range(20):
        choice = choose(memories, procedures, random.Random(seed))
        assert choice.procedure == "factory reset" and choice.followed is None
    everything = [memory(p, "failure") for p in procedures]
    assert {choose(everything, procedures, random.Random(s)).procedure for s in range(50)} == set(procedures)
    assert {choose([], procedures, random.Random(s)).procedure for s in range(50)} == set(procedures)


def test_episode_is_deterministic_and_carries_its_experience() -> None:
    bench = ControlledBenchmark()
    task = bench.tasks()[3]
    fix = task.data["procedure"]
    episode = bench.run_episode(task, [memory(fix)], None, random.Random(7))
    assert episode.success and episode.reward == 1.0 and episode.experience == success_experience(fix)
    assert episode.steps == len(PROCEDURES[fix]) and fix in episode.trajectory
    wrong = next(p for p in bench.procedures if p != fix and p not in task.data["decoys"])
    failed = bench.run_episode(task, [memory(wrong)], None, random.Random(7))
    assert not failed.success and failed.reward == -1.0 and failed.experience == failure_experience(wrong)
    runs = [bench.run_episode(task, [], None, random.Random(f"1:2:{task.id}")) for _ in range(2)]
    assert runs[0] == runs[1]


# -- the experiment -------------------------------------------------------------------------------


class CachedEmbedder:
    """The real embedder, remembering the vector of each text (the task list repeats every epoch)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.name, self.dim, self.similarity = inner, inner.name, inner.dim, inner.similarity
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            self._cache.update(zip(missing, self.inner.embed(missing), strict=True))
        return np.stack([self._cache[t] for t in texts])


def simulate(bench: ControlledBenchmark, mode: str, seed: int, epochs: int, embedder: Embedder, data_dir: Path):
    """The runner's protocol, in process: per epoch, the tasks in a seeded order; per task, recall
    (rag: lambda = 0), the episode, then report (memrl: Q update + store) or store (rag).
    Returns the success rate per epoch and the cumulative success rate per epoch."""
    service = None if mode == "none" else make_service(embedder, data_dir, "edge", **MEMORY_SETTINGS)
    tasks, solved, success, csr = bench.tasks(), set(), [], []
    try:
        for epoch in range(1, epochs + 1):
            order = list(tasks)
            random.Random(f"{seed}:{epoch}").shuffle(order)
            wins = 0
            for task in order:
                recall, memories = None, []
                if service is not None:
                    recall = service.recall(
                        RecallQuery(task.intent, q_weight=0.0 if mode == "rag" else None), access=EVERYTHING
                    )
                    memories = [
                        Memory(m.id, m.task, m.experience, m.outcome, m.q, m.similarity) for m in recall.memories
                    ]
                episode = bench.run_episode(task, memories, None, random.Random(f"{seed}:{epoch}:{task.id}"))
                wins += episode.success
                if episode.success:
                    solved.add(task.id)
                outcome: Outcome = "success" if episode.success else "failure"
                if mode == "memrl":
                    assert service is not None and recall is not None
                    service.report(
                        OutcomeReport(recall.recall_id, episode.reward, experience=episode.experience, outcome=outcome),
                        access=EVERYTHING,
                    )
                elif mode == "rag":
                    assert service is not None
                    service.store_experience(
                        NewExperience(task.intent, episode.experience, outcome=outcome), access=EVERYTHING
                    )
            success.append(wins / len(tasks))
            csr.append(len(solved) / len(tasks))
    finally:
        if service is not None:
            service.close()
    return success, csr


@pytest.mark.slow  # epochs of three modes, four seeds
def test_memrl_above_rag_above_none(embedder: Embedder, tmp_path: Path) -> None:
    """Over seeds, as a learning claim is made: the success of the last two epochs, averaged over four seeds. One
    seed alone can turn (seed 1's last epoch: rag 0.67, memrl 0.53, since a different procedure of a task is a
    memory of its own with Q_init rather than a rewrite of its twin, issue 39.6; memrl was above on seeds 0, 2-5)."""
    bench, cached = ControlledBenchmark(), CachedEmbedder(embedder)
    late: dict[str, list[float]] = {"none": [], "rag": [], "memrl": []}
    csr: dict[str, list[float]] = {"none": [], "rag": [], "memrl": []}
    for seed in SEEDS:
        for mode in late:
            success, solved = simulate(bench, mode, seed, 8, cached, tmp_path / f"{mode}-{seed}")
            late[mode].append(float(np.mean(success[-2:])))
            csr[mode].append(solved[-1])
    mean = {mode: float(np.mean(values)) for mode, values in late.items()}
    assert mean["memrl"] > mean["rag"] > mean["none"], late
    assert mean["rag"] > mean["none"] + 0.25, late  # memory of any kind helps a lot
    assert np.mean(csr["memrl"]) >= np.mean(csr["rag"]) > np.mean(csr["none"]), csr


SEEDS = (0, 1, 2, 3)


def test_paraphrases_keep_the_tasks_and_change_the_words(embedder: Embedder) -> None:
    """``paraphrase=true``: the same ids, families and hidden fixes in other words; each paraphrase is nearest to
    a task of its own appliance (so a memory can transfer) without being a near-duplicate of its original."""
    original, paraphrased = ControlledBenchmark().tasks(), ControlledBenchmark(paraphrase="true").tasks()
    assert [(t.id, t.data, t.type) for t in original] == [(t.id, t.data, t.type) for t in paraphrased]
    assert all(a.intent != b.intent for a, b in zip(original, paraphrased, strict=True))
    assert len({t.intent for t in paraphrased}) == len(paraphrased)
    sims = embedder.embed([t.intent for t in paraphrased]) @ embedder.embed([t.intent for t in original]).T
    appliance = [t.data["family"].rsplit(" ", 1)[0] for t in original]
    assert all(appliance[int(np.argmax(row))] == appliance[i] for i, row in enumerate(sims))
    assert max(sims[i, i] for i in range(len(original))) < embedder.similarity.merge
