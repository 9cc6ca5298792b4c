"""The benchmarks' data, for the tests that read it: found where the harness finds it (memrl_harness.install)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memrl_harness.install import ENV_SHARED_DATA, shared_data_root


def benchmark_data(*parts: str) -> Path:
    """A file or folder of the benchmark data; missing, the test fails saying where it looked and what to do."""
    root = shared_data_root()
    path = root.joinpath(*parts)
    if not path.exists():
        pytest.fail(
            f"benchmark data missing: {path}. Put the data folder at {root}, or set {ENV_SHARED_DATA} to where it "
            "is; what to download and how to lay it out: docs/benchmark-data.md (`memrl-harness data` prints it)",
            pytrace=False,
        )
    return path
