"""The disk a store takes while the same records are rewritten again and again (issue 31), in one process.

For each case and embedded engine, a fresh store (``namespace_quota_mb`` 1, the issue's attack; none for the
cases that add records as they go), one namespace, ``--rewrites`` rewrites:

- **update_memory**: one memory of ``--chars`` characters, its experience replaced by a new one each time;
- **merge**: ``store_experience`` of the same task with a new experience, which merges into its memory (what the
  default ``core`` profile offers);
- **report**: ``recall_experience`` then ``report_outcome`` on that one memory: each Q update rewrites it, every
  8th moves its Q history's tail to a chunk of the history table and deletes the chunk that fell out of
  ``q_history_size`` (each recall also adds its own record, which counts);
- **steps**: ``report_trajectory`` of the same step under a new episode id: the step's record is rewritten, and
  an episode record is added (beyond ``max_reported_episodes`` the oldest go).

Printed per case: the store's size on disk (``du``, holes excluded) at three points, after a clean close and
after a reopen; the namespace's usage as the quota counts it at the end; the calls refused (a namespace at its
quota while the store may not flush for it yet: the caller waits ``GIVE_BACK_EVERY`` and retries). The texts are
distinct random words, which the engine's storage does not compress away.

    .venv/bin/python perf/rewrites.py                                    # 3,000 rewrites of 15,000 characters
    .venv/bin/python perf/rewrites.py --rewrites 20 --engines edge      # a tiny run (tests)
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B

from memrl_mcp.embeddings import MiniLMEmbedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.admission import QuotaExceededError
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import MemoryEdit, NewExperience, OutcomeReport, RecallQuery, TrajectoryReport
from memrl_mcp.settings import load_settings
from memrl_mcp.validation import TrajectoryStep

TASK = "summarise the nightly build log"
NAMESPACE = "tenant"
CASES = ("update_memory", "merge", "report", "steps")
QUOTA_MB = {"update_memory": 1, "merge": 1, "report": 0, "steps": 0}


def distinct_text(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.randbytes(4).hex() for _ in range(chars // 9 + 1))[:chars]


def du_mb(folder: Path) -> float:
    done = subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0]) / 1024


def rewrite(case: str, service: MemoryService, memory_id: str, i: int, chars: int) -> None:
    if case == "update_memory":
        service.update_memory(MemoryEdit(memory_id, experience=distinct_text(i, chars)), access=EVERYTHING)
    elif case == "merge":
        service.store_experience(NewExperience(TASK, distinct_text(i, chars), NAMESPACE), access=EVERYTHING)
    elif case == "report":
        recall = service.recall(RecallQuery(TASK, NAMESPACE, k1=1, k2=1), access=EVERYTHING)
        service.report(OutcomeReport(recall.recall_id, random.Random(i).uniform(-1, 1)), access=EVERYTHING)
    else:
        step = TrajectoryStep(observation=distinct_text(0, 300), action="look", reward=1.0)
        service.report_trajectory(TrajectoryReport(TASK, [step], f"episode-{i}", NAMESPACE), access=EVERYTHING)


def with_retries(call: Callable[[], None], wait: float) -> int:
    """Run ``call``; a refusal by the quota is waited out and retried. The refusals seen."""
    for refusals in range(1000):
        try:
            call()
            return refusals
        except QuotaExceededError:
            time.sleep(wait)
    raise RuntimeError("refused 1000 times in a row")


def measure(case: str, engine: str, args: argparse.Namespace, embedder: MiniLMEmbedder) -> list[object]:
    from memrl_mcp.storage import quota

    wait = getattr(quota, "GIVE_BACK_EVERY", 1.0)  # the baseline has none: it never refuses a rewrite
    with tempfile.TemporaryDirectory(prefix="memrl-rewrites-") as folder:
        data_dir = Path(folder) / "data"
        settings = load_settings(
            data_dir=data_dir, embedded_engine=engine, namespace_quota_mb=QUOTA_MB[case], tool_profile="full"
        )
        service = MemoryService.open(settings, embedder)
        sizes: list[float] = []
        refusals = 0
        try:
            memory_id = service.store_experience(
                NewExperience(TASK, distinct_text(-1, args.chars), NAMESPACE), access=EVERYTHING
            ).id
            for i in range(1, args.rewrites + 1):
                refusals += with_retries(partial(rewrite, case, service, memory_id, i, args.chars), wait)
                if i % max(1, args.rewrites // 3) == 0 and len(sizes) < 3:
                    sizes.append(du_mb(data_dir))
            usage = service._store.usage(NAMESPACE)
        finally:
            service.close()
        closed = du_mb(data_dir)
        MemoryService.open(settings, embedder).close()
        reopened = du_mb(data_dir)
    used = "-" if usage is None else f"{usage / (1 << 20):.2f}"
    return [case, engine, QUOTA_MB[case] or "-", *sizes, closed, reopened, used, refusals]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rewrites", type=int, default=3000)
    parser.add_argument("--chars", type=int, default=15_000, help="characters of each new experience")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--engines", nargs="+", default=["edge", "qdrant-local"], choices=["edge", "qdrant-local"])
    args = parser.parse_args()
    print(B.machine())
    embedder = MiniLMEmbedder()
    rows = [measure(case, engine, args, embedder) for engine in args.engines for case in args.cases]
    thirds = [f"MB at {args.rewrites * k // 3}" for k in (1, 2, 3)]
    headers = ["case", "engine", "quota MB", *thirds, "closed", "reopened", "usage MB", "refused"]
    print(B.table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
