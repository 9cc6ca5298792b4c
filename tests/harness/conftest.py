"""Fixtures for harness tests: a scripted fake LLM server and an ``LLM`` pointed at it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from memrl_harness.llm import LLM
from tests.harness.fake_llm import FakeLLMServer


def alive_processes(marker: str) -> list[int]:
    """Pids of the processes whose command line contains ``marker`` (for teardown checks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@contextmanager
def venv_under(parent: str) -> Iterator[Path]:
    """A virtualenv of this interpreter (no pip: the checks need the standard library) in a new folder under
    ``parent``, removed afterwards: the virtualenv's folder."""
    folder = Path(tempfile.mkdtemp(prefix="memrl-venv-", dir=parent))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
        yield folder / "venv"
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def fake_llm() -> Iterator[FakeLLMServer]:
    """A started fake OpenAI-compatible server on 127.0.0.1 (see ``tests/harness/fake_llm.py``)."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def llm(fake_llm: FakeLLMServer) -> Iterator[LLM]:
    """An ``LLM`` on the fake, with millisecond backoff and a short timeout so retries are fast."""
    client = LLM(
        fake_llm.base_url, fake_llm.model, "test-key", seed=7, timeout=2.0, backoff_base=0.01, backoff_max=0.05
    )
    yield client
    client.close()
