"""Who can read a store, performed: another local user (``nobody``, tests/support/others.py) tries to list every
folder and read every file of a store, a backup and a read-only copy, made by each entry point of memrl-mcp in a
folder that user may enter, and looks for a secret planted in a memory. Before this was closed, every entry point but
the local server made its stores 0755 / 0644: the secret was read out of the write-ahead log and the payload pages."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client

from memrl_harness.results import RunDir
from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.archive import write_records
from memrl_mcp.models import MemoryView
from memrl_mcp.requests import NewExperience
from tests.support.local import local_store
from tests.support.mcp import call, make_service
from tests.support.others import NOBODY, as_nobody, holding, not_private, open_folder, open_up, what_nobody_gets
from tests.support.servers import DEADLINE_S, child_env, http_server, run_cli, stdio_server
from tests.support.stores import ENGINES

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # server processes, and another user's processes
SECRET = "the-vault-password-is-tangerine-4711"
TASK = "Rotate the credentials of the staging database"
NOTHING: dict[str, list[str]] = {"listed": [], "read": [], "found": []}
START_S = 240  # a server's cold start on a loaded machine
HARNESS = [sys.executable, "-m", "memrl_harness.cli"]


@pytest.fixture
def base() -> Iterator[Path]:
    with open_folder("private") as folder:
        yield folder


async def plant(client: Client) -> None:
    stored = await call(client, "store_experience", task=TASK, experience=f"the secret is {SECRET}")
    assert stored["memory"]["experience"].endswith(SECRET)


@asynccontextmanager
async def written_by(entry: str, data_dir: Path, engine: str, embedder: Embedder) -> AsyncIterator[None]:
    """The store at ``data_dir`` made by ``entry``, the secret written in it and acknowledged; open (the server
    running, the service open) until the block ends."""
    engine_env = {"MEMRL_EMBEDDED_ENGINE": engine}
    if entry == "stdio, not attached":
        async with Client(stdio_server(data_dir, **engine_env)) as client:
            await plant(client)
            yield
    elif entry in ("streamable-http", "sse"):
        logs = data_dir.parent / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        with http_server(data_dir, logs, transport=entry, **engine_env) as server:
            async with Client(server.url if entry == "streamable-http" else sse_client(server.url)) as client:
                await plant(client)
            yield
    elif entry == "local server":
        with local_store(data_dir.parent, data_dir.name) as store:
            async with Client(store.session(MEMRL_EMBEDDED_ENGINE=engine)) as client:
                await plant(client)
                yield
            assert store.local("stop").returncode == 0
            store.wait_gone()
    elif entry == "python API":  # MemoryService.open in an application whose umask lets everyone read
        umask = os.umask(0o022)
        try:
            service = make_service(embedder, data_dir, engine)
            try:
                service.store_experience(NewExperience(TASK, f"the secret is {SECRET}"), access=EVERYTHING)
                yield
            finally:
                service.close()
        finally:
            os.umask(umask)
    elif entry == "import":
        backup = data_dir.parent / "logs" / "backup.jsonl"
        backup.parent.mkdir(mode=0o700)
        with backup.open("wb") as stream:
            write_records([memory(f"the secret is {SECRET}")], stream)
        done = run_cli("import", str(backup), "--data-dir", str(data_dir), env=child_env(**engine_env), timeout=120)
        assert done.returncode == 0, done.stderr
        yield
    else:
        raise AssertionError(entry)


def memory(experience: str) -> MemoryView:
    return MemoryView(
        id=str(uuid.uuid4()),
        namespace="default",
        task=TASK,
        experience=experience,
        outcome="success",
        q=0.5,
        visits=1,
        last_reward=1.0,
        merges=0,
        created_at=1.7e9,
        updated_at=1.7e9,
        metadata={},
    )


def assert_unreadable(data_dir: Path) -> None:
    """The secret is in the store's files (root reads it there), and nobody lists, reads or finds anything."""
    assert holding(SECRET, data_dir), "the secret is in no file of the store: the attack would prove nothing"
    assert what_nobody_gets(SECRET, data_dir) == NOTHING


ENTRIES = ["stdio, not attached", "streamable-http", "sse", "local server", "python API", "import"]


@pytest.mark.parametrize("entry", ENTRIES)
async def test_every_entry_point_makes_a_store_only_its_user_can_read(
    entry: str, base: Path, embedder: Embedder
) -> None:
    """While the store is open and after it is closed: nobody can list a folder or read a file of it (the WAL, the
    segments, the payload pages, usage.json), and every folder is 0700, every file 0600 (an application's umask of
    022 included: what the engine made meanwhile is sealed at the close)."""
    data_dir = base / "data"
    with anyio.fail_after(START_S):
        async with written_by(entry, data_dir, "edge", embedder):
            assert_unreadable(data_dir)
    assert_unreadable(data_dir)
    assert not_private(data_dir) == []
    assert (data_dir / "memrl" / "edge" / "usage.json").is_file()  # among what nobody could read


@pytest.mark.parametrize("entry", ["stdio, not attached", "python API"])
async def test_qdrant_clients_local_mode_makes_a_private_store_too(entry: str, base: Path, embedder: Embedder) -> None:
    data_dir = base / "data"
    with anyio.fail_after(START_S):
        async with written_by(entry, data_dir, "qdrant-local", embedder):
            assert_unreadable(data_dir)
    assert_unreadable(data_dir)
    assert not_private(data_dir) == []


def seed(embedder: Embedder, data_dir: Path, engine: str, tasks: int = 1) -> None:
    """A store holding the secret, then opened to everyone, as a store made with an open umask (by memrl-mcp before
    this was fixed, or by a copy) is found; nobody can read the secret out of it."""
    service = make_service(embedder, data_dir, engine)
    try:
        service.store_experience(NewExperience(TASK, f"the secret is {SECRET}"), access=EVERYTHING)
        for number in range(1, tasks):
            task = f"task {number}: {TASKS[number % len(TASKS)]}"
            service.store_experience(NewExperience(task, "done"), access=EVERYTHING)
    finally:
        service.close()
    open_up(data_dir)
    assert what_nobody_gets(SECRET, data_dir)["found"], "the store opened to everyone gives the secret away"


TASKS = ("sort a CSV by date", "resize a PNG", "count words in a log", "parse an ISO date", "merge two JSON files")


@pytest.mark.parametrize(
    ("entry", "engine"),
    [("stdio, not attached", "edge"), ("stdio, not attached", "qdrant-local"), ("local server", "edge")],
)
async def test_a_store_found_open_to_others_is_made_private_at_open(
    entry: str, engine: str, base: Path, embedder: Embedder
) -> None:
    """A store of this user with folders 0755 and files 0644 is made private before the engine opens it, and the
    server says so in its log; then it serves it as before."""
    data_dir = base / "data"
    seed(embedder, data_dir, engine)
    log = base / "server.log"
    with anyio.fail_after(START_S), log.open("w") as errlog:
        if entry == "local server":
            with local_store(base, data_dir.name) as store:
                async with Client(store.session(MEMRL_EMBEDDED_ENGINE=engine)) as client:
                    recalled = await call(client, "recall_experience", task=TASK)  # the handshake waits for no server
                    assert what_nobody_gets(SECRET, data_dir) == NOTHING
                errlog.write(store.place.log.read_text())
        else:
            server = stdio_server(data_dir, MEMRL_EMBEDDED_ENGINE=engine)
            async with Client(stdio_client(server, errlog=errlog)) as client:
                assert what_nobody_gets(SECRET, data_dir) == NOTHING
                recalled = await call(client, "recall_experience", task=TASK)
    assert recalled["memories"][0]["experience"].endswith(SECRET)
    assert not_private(data_dir) == []
    assert f"the memory store at {data_dir} was open to other users" in log.read_text()


def snapshot(data_dir: Path) -> dict[str, tuple[int, int, int, int]]:
    found = {}
    for folder, _, files in os.walk(data_dir):
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            info = os.lstat(path)
            found[path] = (info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns)
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_another_users_store_open_to_others_is_refused_with_the_fix(
    engine: str, base: Path, embedder: Embedder
) -> None:
    """A store that belongs to another user and is open to everyone is not served (its memories would be written
    where anyone reads them) nor changed: the refusal names the command that fixes it; once its owner ran it, the
    store is served."""
    data_dir = base / "data"
    seed(embedder, data_dir, engine)
    for folder, _, files in os.walk(data_dir):
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            os.chown(path, NOBODY, NOBODY)
    before = snapshot(data_dir)
    env = child_env(data_dir, MEMRL_EMBEDDED_ENGINE=engine)
    refused = run_cli(env=env, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    fix = f"chmod -R go= {data_dir}"
    assert f"the memory store at {data_dir} is open to other users" in refused.stderr
    assert f"`{fix}`" in refused.stderr and "user nobody" in refused.stderr
    assert snapshot(data_dir) == before  # not a mode, not a byte changed

    assert as_nobody(*fix.split()).returncode == 0  # the owner runs the fix
    assert not_private(data_dir) == []
    served = run_cli(env=env, timeout=120)  # stdin closed: the server opens the store, then sees EOF
    assert served.returncode == 0, served.stderr


async def test_readers_make_the_store_and_what_they_write_private(base: Path, embedder: Embedder) -> None:
    """export (its file), a read-only server (its copy of the store in TMPDIR, read while it serves) and calibrate
    (its output): each leaves nothing another user can read, and makes the open store it reads private, with TMPDIR
    a folder anyone may enter."""
    data_dir, scratch = base / "data", base / "tmp"
    scratch.mkdir(mode=0o755)
    scratch.chmod(0o755)
    seed(embedder, data_dir, "edge", tasks=24)  # calibrate needs 20 distinct tasks
    env = child_env(TMPDIR=str(scratch))

    backup = base / "backup.jsonl"
    exported = run_cli("export", "--out", str(backup), "--data-dir", str(data_dir), env=env, timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert SECRET in backup.read_text()
    assert what_nobody_gets(SECRET, backup, data_dir) == NOTHING
    assert not_private(backup, data_dir) == []

    open_up(data_dir)
    with anyio.fail_after(DEADLINE_S):
        async with Client(stdio_server(data_dir, TMPDIR=str(scratch), MEMRL_TOOL_PROFILE="read_only")) as client:
            found = await call(client, "search_experience", task=TASK)
            assert found["memories"][0]["experience"].endswith(SECRET)
            (copy,) = scratch.glob("memrl-read-only-*")
            assert_unreadable(copy)
            assert not_private(copy, data_dir) == []
            assert what_nobody_gets(SECRET, data_dir) == NOTHING

    open_up(data_dir)
    output = base / "calibration.yaml"
    calibrate = ["calibrate", "--namespace", "default", "--out", str(output), "--data-dir", str(data_dir)]
    calibrated = run_cli(*calibrate, env=env, timeout=300)
    assert calibrated.returncode == 0, calibrated.stderr
    assert what_nobody_gets("delta", output, data_dir) == NOTHING
    assert not_private(output, data_dir) == []
    assert list(scratch.glob("memrl-read-only-*")) == []  # each copy removed at its close (onnxruntime leaves a .ses)


def test_a_benchmark_runs_folder_is_its_users_alone(base: Path) -> None:
    """The harness's run folder holds its memory store, its episodes and trajectories (the memories recalled into
    each prompt among them) and its memory server's log: none of it can another user list or read."""
    run_dir = base / "runs" / "controlled-memrl"
    run = [
        *HARNESS,
        "run",
        "controlled",
        "--mode",
        "memrl",
        "--run-dir",
        str(run_dir),
        "--tasks",
        "16",
        "--epochs",
        "1",
    ]
    env = {name: value for name, value in os.environ.items() if not name.startswith("MEMRL_")}
    done = subprocess.run(run, cwd=base, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    stored = next(record.stored_id for record in RunDir(run_dir).episodes() if record.stored_id)
    assert len(holding(stored, run_dir)) >= 2  # the episodes and the store's write-ahead log name the memory
    assert {path.name for path in run_dir.iterdir()} >= {"episodes.jsonl", "trajectories.jsonl.gz", "memory"}
    assert what_nobody_gets(stored, run_dir) == NOTHING
