"""Shared fixtures: one real embedder per session, a fresh real store per test, both engines; and the two tiers.

``make test`` runs every test. ``make test-fast`` runs those not marked ``slow``, in process, in a few minutes. A test
marks itself slow (``@pytest.mark.slow``, or ``pytestmark`` for a whole module) when it needs a service or a build
(MariaDB, a Docker engine, chromium, the sandboxes, the local LLM, a wheel, the benchmark data), starts a process,
kills one or mounts a filesystem; a test run on both embedded engines is slow on the second (qdrant-client's local
mode is the fallback engine: ``ENGINES``). The marks are kept honest here: a test not marked slow that starts a
process fails, naming what it started."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder, MiniLMEmbedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.surface.server import create_server
from tests.support.mcp import make_service
from tests.support.servers import ONE_PROCESS
from tests.support.stores import ENGINES

os.environ.update(ONE_PROCESS)  # memrl-mcp processes spawned with this environment as well (child_env sets it too)
# The harness's plots use the fonts matplotlib ships; without this, its first import in a fresh HOME runs fc-list to
# list the system's fonts for its cache: a process started by whichever fast test draws first.
os.environ["MPL_IGNORE_SYSTEM_FONTS"] = "1"

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"})
"""The audit events (sys.addaudithook) of starting a process: what only a slow test may do. Signals are not watched:
a test kills only what it started, and a transport collected late may stop its process during another test."""


class ProcessWatch:
    """What the running test, when it is not marked slow, started (in any thread)."""

    def __init__(self) -> None:
        self.seen: list[str] | None = None  # None: the running test may start processes

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.seen is not None and event in PROCESS_EVENTS:
            self.seen.append(f"{event} {args[:2]!r}"[:200])


WATCH = ProcessWatch()
platform.processor()  # runs `uname -p` once per process, cached: here, not in the first test whose client asks it
sys.addaudithook(WATCH.audit)  # an audit hook cannot be removed: it watches only while ``seen`` is a list


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Watch the test from its first fixture on, unless it is marked slow."""
    WATCH.seen = None if item.get_closest_marker("slow") else []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """A fast test that started a process fails here, once its fixtures are torn down. The teardown
    is not watched: a module's server, stopped after the module's last test, belongs to the tests that used it."""
    seen, WATCH.seen = WATCH.seen, None
    yield
    if seen:
        pytest.fail(
            f"{item.nodeid} is not marked slow but started a process: mark it @pytest.mark.slow "
            f"(tests/conftest.py). It did: {'; '.join(dict.fromkeys(seen))}",
            pytrace=False,
        )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return MiniLMEmbedder()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Every test that takes this runs on both embedded engines (one shared suite)."""
    return str(request.param)


@pytest.fixture
def service(embedder: Embedder, tmp_path: Path, engine: str) -> Iterator[MemoryService]:
    svc = make_service(embedder, tmp_path / "data", engine)
    yield svc
    svc.close()


@pytest.fixture
async def client(service: MemoryService) -> AsyncIterator[Client]:
    async with Client(create_server(service)) as mcp_client:
        yield mcp_client
