"""A trajectory report interrupted at any of its writes (an exception there, or a real SIGKILL of the process) is
finished when the store reopens: every step applied exactly once, the recall it names reported exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memrl_mcp.embeddings import Embedder, embed_scoped, embed_tasks
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.records import EpisodeRecord, ReportedStep, StepPayload, episode_key, step_id
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.memory.steps import EpisodeGoneError
from memrl_mcp.models import ActionView
from memrl_mcp.requests import ForgetRequest, NewExperience, RecallQuery, StatsQuery, TrajectoryReport
from memrl_mcp.settings import Settings, load_settings
from memrl_mcp.storage import PLACEHOLDER, Point, Store, Table, open_store
from tests.support.crashes import WRITES, CountingStore, DiesAtWrite
from tests.support.servers import child_env
from tests.support.steps import MUG, SUCCESS, records, steps_of, synthetic_trajectory

# A report of 3 new steps with a recall writes 11 times: the episode claim; per step the progress point (saying what
# the step is about to do) and the new record; the recall's claim, its memory, its "reported"; then the episode's
# "reported" (the progress point's delete follows).
REPORT_WRITES = 11
CHILD = """
import os, signal, sys
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import open_store
from tests.support.steps import MUG, SUCCESS, synthetic_trajectory
from memrl_mcp.requests import RecallQuery, TrajectoryReport

class KilledAtWrite:
    def __init__(self, store, n):
        self._store, self._left = store, n
    def __getattr__(self, name):
        method = getattr(self._store, name)
        if name not in ("upsert", "insert", "set_payload", "set_payload_if"):
            return method
        def write(*args, **kwargs):
            if self._left == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            self._left -= 1
            return method(*args, **kwargs)
        return write

data_dir, engine, kill_at, recall_id, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
settings = load_settings(data_dir=data_dir, embedded_engine=engine)
service = MemoryService.open(settings, store=KilledAtWrite(open_store(settings.storage, 384), kill_at))
steps = SUCCESS if steps == "success" else synthetic_trajectory(0, int(steps), 300, 900)
service.report_trajectory(TrajectoryReport(MUG, steps, "episode-1", recall_id=recall_id or None), access=EVERYTHING)
print("finished without being killed", flush=True)
"""


def killed_at_write(settings: Settings, kill_at: int, recall_id: str, steps: str) -> None:
    """A process reporting ``steps`` ("success": SUCCESS; a number: that many steps of the issue's shape) is
    SIGKILLed just before its write number ``kill_at`` (0-based)."""
    root = Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(settings.storage.data_dir),
            settings.storage.embedded_engine,
            str(kill_at),
            recall_id,
            steps,
        ],
        env=child_env(PYTHONPATH=str(root)),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr


def seed(settings: Settings, embedder: Embedder) -> tuple[str, str]:
    """A memory and a recall that returned it: (memory id, recall id)."""
    service = MemoryService.open(settings, embedder)
    try:
        memory = service.store_experience(NewExperience(MUG, "rinse the mug first"), access=EVERYTHING)
        recall = service.recall(RecallQuery(MUG), access=EVERYTHING)
        assert [m.id for m in recall.memories] == [memory.id]
        return memory.id, recall.recall_id
    finally:
        service.close()


def assert_applied_once(
    settings: Settings, embedder: Embedder, memory_id: str, recall_id: str, crashed_at: int
) -> None:
    store = open_store(settings.storage, embedder.dim)
    reopened = MemoryService.open(settings, embedder, store)  # finishes the interrupted report
    try:
        if crashed_at == 0:  # died before claiming the episode: nothing was applied, the report can be sent again
            assert records(reopened) == {}
            reopened.report_trajectory(
                TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1", recall_id=recall_id), access=EVERYTHING
            )
        learned = {r["observation"]: r["actions"] for r in records(reopened).values()}
        # n = 1, gamma = 1, mean, credited last to first: the final reward reaches every step, targets 1, 1, 1.
        assert {o: [(a["action"], a["q"], a["visits"]) for a in actions] for o, actions in learned.items()} == {
            step["observation"]: [(step["action"], 1.0, 1)] for step in SUCCESS
        }
        memory = reopened.get(memory_id, access=EVERYTHING)
        assert (memory.q, memory.visits, memory.last_reward) == pytest.approx((0.3, 1, 1.0))
        again = reopened.report_trajectory(
            TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1", recall_id=recall_id), access=EVERYTHING
        )
        # The stored result counts each step once, as the uninterrupted report would have: 3 records created.
        assert again.already_applied
        assert (again.updated, again.created, again.merged, again.dropped) == (3, 3, 0, 0)
        stats = reopened.stats(StatsQuery(), access=EVERYTHING)
        assert (stats.steps, stats.episodes_reported, stats.recalls_reported) == (3, 1, 1)
        assert store.count("episodes") == 1  # the episode record alone: no progress point is left behind
    finally:
        reopened.close()


@pytest.mark.parametrize("crash_at", range(REPORT_WRITES + 1))
def test_an_interrupted_trajectory_is_finished_once_on_reopen(
    embedder: Embedder, tmp_path: Path, engine: str, crash_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    memory_id, recall_id = seed(settings, embedder)
    store = open_store(settings.storage, embedder.dim)
    dying = MemoryService(settings, embedder, DiesAtWrite(store, crash_at))
    if crash_at < REPORT_WRITES:
        with pytest.raises(KeyboardInterrupt):
            dying.report_trajectory(
                TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1", recall_id=recall_id), access=EVERYTHING
            )
    else:  # the count above is exact: one more write than the report makes lets it finish
        assert (
            dying.report_trajectory(
                TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1", recall_id=recall_id), access=EVERYTHING
            ).updated
            == 3
        )
    store.close()
    assert_applied_once(settings, embedder, memory_id, recall_id, crash_at)


@pytest.mark.slow  # kills a child process
@pytest.mark.parametrize("kill_at", [0, 3, 6, 9, 10])
def test_a_sigkilled_report_is_finished_once_on_reopen(
    embedder: Embedder, tmp_path: Path, engine: str, kill_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    memory_id, recall_id = seed(settings, embedder)
    killed_at_write(settings, kill_at, recall_id, "success")
    assert_applied_once(settings, embedder, memory_id, recall_id, kill_at)


class ForgetsAtWrite:
    """The real store, except that the namespace is forgotten (by another caller) just before its n-th write."""

    def __init__(self, store: Store, forget: Callable[[], object], n: int) -> None:
        self._store, self._forget, self._left = store, forget, n

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in WRITES:
            return method

        def write(*args: Any, **kwargs: Any) -> Any:
            if self._left == 0:
                self._forget()
            self._left -= 1
            return method(*args, **kwargs)

        return write


# Without a recall a report of 3 new steps writes 8 times (the claim, 3 x 2 per step, "reported").
@pytest.mark.parametrize("forget_at", range(8))
def test_a_namespace_forgotten_mid_report_never_comes_back(
    embedder: Embedder, tmp_path: Path, engine: str, forget_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    store = open_store(settings.storage, embedder.dim)
    other = MemoryService(settings, embedder, store)
    reporter = MemoryService(
        settings,
        embedder,
        ForgetsAtWrite(store, lambda: other.forget(ForgetRequest(namespace="default"), access=EVERYTHING), forget_at),
    )
    try:
        if forget_at == 0:  # forgotten before the report wrote anything: the report is simply newer
            assert (
                reporter.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e"), access=EVERYTHING).created
                == 3
            )
            assert other.stats(StatsQuery(), access=EVERYTHING).steps == 3
            return
        if forget_at < 7:  # a step record is created after the forget: the report sees its episode gone, stops
            with pytest.raises(EpisodeGoneError, match="episode_id: episode 'e' is gone"):
                reporter.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e"), access=EVERYTHING)
        else:  # every record was created before: the forget took them with it, the report's last writes miss
            reporter.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "e"), access=EVERYTHING)
        stats = other.stats(StatsQuery(), access=EVERYTHING)
        assert (stats.steps, stats.episodes_reported) == (0, 0)
        assert records(other) == {}
        assert store.count("episodes") == 0  # nor a progress point the report wrote after the forget
    finally:
        store.close()


class DiesAtProgressDelete:
    """The real store, except that the process 'dies' when it deletes an episode's progress point: the last step of
    a report, after the episode is marked reported."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        if table == "episodes":
            raise KeyboardInterrupt("killed before the progress point's delete")
        self._store.delete(table, ids)


def test_a_progress_point_left_behind_is_dropped_at_the_next_open(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    MemoryService.open(settings, embedder).close()
    store = open_store(settings.storage, embedder.dim)
    dying = MemoryService(settings, embedder, DiesAtProgressDelete(store))
    with pytest.raises(KeyboardInterrupt):
        dying.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1"), access=EVERYTHING)
    assert store.count("episodes", {"status": "progress"}) == 1
    store.close()
    store = open_store(settings.storage, embedder.dim)
    reopened = MemoryService.open(settings, embedder, store)
    try:
        assert store.count("episodes", {"status": "progress"}) == 0 and store.count("episodes") == 1
        again = reopened.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1"), access=EVERYTHING)
        assert again.already_applied and (again.updated, again.created) == (3, 3)
    finally:
        reopened.close()


# Without a recall, a report of new steps writes the claim, then per step its progress point and its record: step
# k's record is write 2 + 2k. Killed just after step 5's record landed, before the progress point says so.
STEPS, LANDED = 12, 5


@pytest.mark.slow  # kills a child process
def test_a_report_killed_mid_episode_resumes_where_it_stopped_and_counts_each_step_once(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """Issue 22: after a SIGKILL in the middle of an episode the next start redid far more than the unfinished steps
    (each step rewrote and read back the whole trajectory) and the stored result undercounted the applied steps.
    Now the restart writes only the records of the steps not yet applied, reads the trajectory once, and the result
    counts every step once, the one in flight at the kill included."""
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    MemoryService.open(settings, embedder).close()  # a store in use (a new one's first write is its schema marker)
    killed_at_write(settings, 3 + 2 * LANDED, "", str(STEPS))
    steps = synthetic_trajectory(0, STEPS, 300, 900)
    ids = [step_id("default", MUG, step["observation"]) for step in steps]
    counting = CountingStore(open_store(settings.storage, embedder.dim))
    reopened = MemoryService.open(settings, embedder, counting)  # finishes the report
    try:
        assert counting.written["steps"] == set(ids[LANDED + 1 :])  # step 5 had landed: not written again
        assert counting.reads[episode_key("default", "episode-1")] == 1  # the trajectory, read once
        again = reopened.report_trajectory(TrajectoryReport(MUG, steps_of(steps), "episode-1"), access=EVERYTHING)
        assert again.already_applied
        assert (again.steps, again.updated, again.created, again.merged, again.dropped) == (STEPS, STEPS, STEPS, 0, 0)
        assert sorted(a.visits for r in reopened.step_records() for a in r.actions) == [1] * STEPS
        assert counting.count("episodes") == 1  # the episode record alone: its progress point is gone
    finally:
        reopened.close()


def test_an_episode_claimed_before_version_3_is_finished_from_its_own_count(
    embedder: Embedder, tmp_path: Path, engine: str
) -> None:
    """A store written by the previous version, killed mid-report: its episode record counted the steps done itself
    (1), and named the step operations after the record's id; the step after them (1) had landed too. The new
    version finishes it without applying any step twice."""
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    store = open_store(settings.storage, embedder.dim)
    key = episode_key("default", "episode-1")
    targets = [0.0, 0.0, 1.0]  # n = 1, gamma = 1, no record known when claimed
    record = EpisodeRecord(
        namespace="default",
        episode_id="episode-1",
        task=MUG,
        claim="an-old-claim",
        status="applying",
        reported_at=1.7e9,
        recall_id=None,
        steps=[ReportedStep(**step, target=g) for step, g in zip(SUCCESS, targets, strict=True)],
        done=1,
    )
    old_shape = {**record.model_dump(), "steps": [step.model_dump() for step in record.steps]}  # a list, not text
    store.insert("episodes", Point(key, PLACEHOLDER, old_shape))
    task = embed_tasks(embedder, [MUG], "default")[0]
    for t in (0, 1):  # applied as the previous version did: created empty, then updated under its operation
        step = SUCCESS[t]
        vector = np.concatenate([task, embed_scoped(embedder, [step["observation"]], "default")[0]])
        action = ActionView(action=step["action"], q=targets[t], visits=1, reward=step["reward"])
        payload = StepPayload(
            namespace="default",
            task=MUG,
            observation=step["observation"],
            actions=[action],
            created_at=1.7e9,
            updated_at=1.7e9,
            version=1,
            applied=[f"step:{key}:{t}"],
        )
        store.upsert("steps", [Point(step_id("default", MUG, step["observation"]), vector, payload.model_dump())])
    store.close()

    reopened = MemoryService.open(settings, embedder)
    try:
        learned = {r.observation: [(a.action, a.q, a.visits) for a in r.actions] for r in reopened.step_records()}
        assert learned == {s["observation"]: [(s["action"], s["reward"], 1)] for s in SUCCESS}
        again = reopened.report_trajectory(TrajectoryReport(MUG, steps_of(SUCCESS), "episode-1"), access=EVERYTHING)
        assert again.already_applied and again.updated == 3
    finally:
        reopened.close()
