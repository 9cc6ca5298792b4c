"""Fixtures for harness tests: a scripted fake LLM server and an ``LLM`` pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memrl_harness.llm import LLM
from tests.harness.fake_llm import FakeLLMServer


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
