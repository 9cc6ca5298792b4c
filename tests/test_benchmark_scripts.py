"""Every benchmark script of perf/ runs at a tiny size, so that a change of the service breaks the build, not the
next measurement (the figures of docs/performance.md come from the same scripts at full size)."""

import os
from pathlib import Path

import pytest

from tests.support.scripts import PERF, run

# needs the perf/ scripts (and the peer server): `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "args", "printed"),
    [
        ("latency.py", ("--sizes", "300", "--queries", "15"), "MCP stdio"),
        ("backends.py", ("--sizes", "300", "--queries", "10", "--budget", "5"), "qdrant-edge"),
        ("load.py", ("--clients", "2", "--seconds", "3", "--seed-memories", "50"), "LOST UPDATES 0"),
        (
            "load.py",
            ("--clients", "2", "--seconds", "2", "--seed-memories", "30", "--against", "MEMRL_EMBEDDING_CACHE=0"),
            "B / A, per pair of runs",
        ),
        ("embedders.py", ("--rounds", "1", "--queries", "5", "--texts", "40"), "fp32 (FastEmbed's all-MiniLM-L6-v2)"),
        ("history_cost.py", ("--events", "5", "--rounds", "2", "--cycles", "20"), "as JSON text"),
        ("cycle_cost.py", ("--rounds", "2", "--passes", "1", "--tasks", "5", "--age", "3"), "full / fresh"),
        ("write_costs.py", ("--tasks", "3", "--age", "3", "--rounds", "2", "--writes", "20"), "metered (quota)"),
        ("step_capacity.py", ("--capacities", "20", "--steps", "3", "--runs", "2"), "same pick"),
        ("rewrites.py", ("--rewrites", "6", "--chars", "500", "--engines", "edge"), "reopened"),
        ("open_room.py", ("--memories", "0", "50"), "asks MB free"),
        ("tool_list.py", ("--profile", "core"), "core: "),
        ("cold_start.py", ("--runs", "1"), "cold / warm: "),
        ("claude_hooks.py", ("--runs", "1", "--memories", "6"), "context a prompt's hook added"),
        ("followups.py", ("--limit", "20"), "continues: accuracy"),
        ("local_fairness.py", ("--runs", "1", "--recalls", "5", "--in-flight", "4", "--seed", "3"), "flood / alone"),
        (
            "scale.py",
            (
                "--size",
                "2500",
                "--queries",
                "10",
                "--ef",
                "32",
                "--pause",
                "0",
                "--import-size",
                "300",
                "--exact-sizes",
                "500",
                "1000",
            ),
            "recall@5 mean",
        ),
    ],
)
def test_the_benchmark_runs_at_a_tiny_size(script: str, args: tuple[str, ...], printed: str) -> None:
    assert printed in run(script, *args)


def test_the_peer_comparison_runs_at_a_tiny_size() -> None:
    peer = Path(os.environ.get("MEMRL_PEER", PERF.parent / ".venv-peer" / "bin" / "mcp-server-qdrant"))
    assert peer.is_file(), f"the peer (mcp-server-qdrant) is not installed at {peer}: run `make peer`"
    printed = run("peer.py", "--sizes", "300", "--queries", "3", "--peer", str(peer), "--compare-threads", "1")
    assert "our recall p50 below the peer's find p50" in printed
    assert "1 thread(s): recall p50 ms" in printed  # the second server of ours, with embedding_threads=1
