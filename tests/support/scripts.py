"""Running the perf/ scripts at a tiny size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PERF = Path(__file__).resolve().parents[2] / "perf"


def run(script: str, *args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, str(PERF / script), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
