"""A trajectory report interrupted at any of its writes (an exception there, or a real SIGKILL of the process) is
finished when the store reopens: every step applied exactly once, the recall it names reported exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.memory.steps import EpisodeGone
from memrl_mcp.models import RecallQuery
from memrl_mcp.settings import Settings, load_settings
from memrl_mcp.storage import Store, open_store
from tests.test_recovery import WRITES, DiesAtWrite
from tests.test_steps import MUG, SUCCESS, records
from tests.test_transports import child_env

# A report of 3 new steps with a recall writes 14 times: the episode claim; per step the new record, its update
# and the progress mark; the recall's claim, its memory, its "reported"; then the episode's "reported".
REPORT_WRITES = 14
CHILD = """
import os, signal, sys
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import RecallQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import open_store
from tests.test_steps import MUG, SUCCESS

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

data_dir, engine, kill_at, recall_id = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
settings = load_settings(data_dir=data_dir, embedded_engine=engine)
service = MemoryService.open(settings, store=KilledAtWrite(open_store(settings.storage, 384), kill_at))
service.report_trajectory(MUG, SUCCESS, "episode-1", recall_id=recall_id, access=EVERYTHING)
print("finished without being killed", flush=True)
"""


def seed(settings: Settings, embedder: Embedder) -> tuple[str, str]:
    """A memory and a recall that returned it: (memory id, recall id)."""
    service = MemoryService.open(settings, embedder)
    try:
        memory = service.store_experience(MUG, "rinse the mug first", access=EVERYTHING)
        recall = service.recall(RecallQuery(MUG), access=EVERYTHING)
        assert [m.id for m in recall.memories] == [memory.id]
        return memory.id, recall.recall_id
    finally:
        service.close()


def assert_applied_once(
    settings: Settings, embedder: Embedder, memory_id: str, recall_id: str, crashed_at: int
) -> None:
    reopened = MemoryService.open(settings, embedder)  # finishes the interrupted report
    try:
        if crashed_at == 0:  # died before claiming the episode: nothing was applied, the report can be sent again
            assert records(reopened) == {}
            reopened.report_trajectory(MUG, SUCCESS, "episode-1", recall_id=recall_id, access=EVERYTHING)
        learned = {r["observation"]: r["actions"] for r in records(reopened).values()}
        # n = 1, gamma = 1, mean; no record existed when the targets were computed: targets 0, 0 and 1.
        assert {o: [(a["action"], a["q"], a["visits"]) for a in actions] for o, actions in learned.items()} == {
            step["observation"]: [(step["action"], step["reward"], 1)] for step in SUCCESS
        }
        memory = reopened.get(memory_id, access=EVERYTHING)
        assert (memory.q, memory.visits, memory.last_reward) == (pytest.approx(0.3), 1, 1.0)
        again = reopened.report_trajectory(MUG, SUCCESS, "episode-1", recall_id=recall_id, access=EVERYTHING)
        assert again.already_applied and again.updated == 3
        stats = reopened.stats(access=EVERYTHING)
        assert (stats.steps, stats.episodes_reported, stats.recalls_reported) == (3, 1, 1)
    finally:
        reopened.close()


@pytest.mark.parametrize("crash_at", range(REPORT_WRITES + 1))
def test_an_interrupted_trajectory_is_finished_once_on_reopen(
    embedder: Embedder, tmp_path: Path, engine: str, crash_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    memory_id, recall_id = seed(settings, embedder)
    store = open_store(settings.storage, embedder.dim)
    dying = MemoryService(settings, embedder, DiesAtWrite(store, crash_at))  # type: ignore[arg-type]
    if crash_at < REPORT_WRITES:
        with pytest.raises(KeyboardInterrupt):
            dying.report_trajectory(MUG, SUCCESS, "episode-1", recall_id=recall_id, access=EVERYTHING)
    else:  # the count above is exact: one more write than the report makes lets it finish
        assert dying.report_trajectory(MUG, SUCCESS, "episode-1", recall_id=recall_id, access=EVERYTHING).updated == 3
    store.close()
    assert_applied_once(settings, embedder, memory_id, recall_id, crash_at)


@pytest.mark.parametrize("kill_at", [0, 2, 6, 10, 13])
def test_a_sigkilled_report_is_finished_once_on_reopen(
    embedder: Embedder, tmp_path: Path, engine: str, kill_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    memory_id, recall_id = seed(settings, embedder)
    root = Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), engine, str(kill_at), recall_id],
        env=child_env(PYTHONPATH=str(root)),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
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


# Without a recall a report of 3 new steps writes 11 times (the claim, 3 x 3 per step, "reported").
@pytest.mark.parametrize("forget_at", range(11))
def test_a_namespace_forgotten_mid_report_never_comes_back(
    embedder: Embedder, tmp_path: Path, engine: str, forget_at: int
) -> None:
    settings = load_settings(data_dir=tmp_path, embedded_engine=engine)
    store = open_store(settings.storage, embedder.dim)
    other = MemoryService(settings, embedder, store)
    reporter = MemoryService(
        settings,
        embedder,
        ForgetsAtWrite(store, lambda: other.forget(namespace="default", access=EVERYTHING), forget_at),  # type: ignore[arg-type]
    )
    try:
        if forget_at == 0:  # forgotten before the report wrote anything: the report is simply newer
            assert reporter.report_trajectory(MUG, SUCCESS, "e", access=EVERYTHING).created == 3
            assert other.stats(access=EVERYTHING).steps == 3
            return
        if forget_at < 8:  # a step record is created after the forget: the report sees its episode gone, stops
            with pytest.raises(EpisodeGone, match="episode_id: episode 'e' is gone"):
                reporter.report_trajectory(MUG, SUCCESS, "e", access=EVERYTHING)
        else:  # every record was created before: the forget took them with it, the report's last writes miss
            reporter.report_trajectory(MUG, SUCCESS, "e", access=EVERYTHING)
        stats = other.stats(access=EVERYTHING)
        assert (stats.steps, stats.episodes_reported) == (0, 0)
        assert records(other) == {}
    finally:
        store.close()
