"""A full disk never kills the server nor loses what it acknowledged (issues 11.8, 22.3), on a real small filesystem.

qdrant-edge writes through memory-mapped files; on a full disk the page it cannot allocate used to kill the server
with SIGBUS mid-stream. Here a loop-mounted ext4 image (root: ``mount -o loop``) holds the store, a ballast file
leaves a little room, and the real HTTP server is written to until it refuses: writes must be refused with the
message before a crash, reads must keep working, writes must work again once space is freed, and every
acknowledged memory must be there after a restart on the same disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import DiskFullError, open_store
from tests.support.crashes import DiesAtWrite
from tests.support.mcp import call, make_service, refused
from tests.support.servers import child_env, http_server, mcp_client, run_cli, stdio_server
from tests.support.stores import small_disk

pytestmark = pytest.mark.slow  # mounts small filesystems, servers in child processes

DISK_MB, MARGIN_MB, ROOM_ABOVE_MARGIN_MB = 96, 8, 3
EXPERIENCE_CHARS = 15_000  # a long experience: the disk fills in a few hundred writes
WORDS = ("parse", "rotate", "index", "backup", "deploy", "compile", "join", "filter", "migrate", "cache", "render")


def free_mb(path: Path) -> float:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize / (1 << 20)


def leave_free(disk: Path, megabytes: float) -> Path:
    """A ballast file that takes all the free space of ``disk`` but ``megabytes``."""
    ballast = disk / "ballast"
    with ballast.open("wb") as file:
        os.posix_fallocate(file.fileno(), 0, int((free_mb(disk) - megabytes) * (1 << 20)))
    return ballast


def task_text(rng: random.Random, i: int) -> str:
    return f"Job {i}: " + " ".join(rng.choice(WORDS) for _ in range(12))


@pytest.mark.anyio
async def test_a_full_disk_refuses_writes_keeps_reads_and_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(5)
    env = {"MEMRL_MIN_FREE_DISK_MB": str(MARGIN_MB)}
    with small_disk(tmp_path, DISK_MB) as disk:
        data_dir = disk / "data"
        acknowledged: set[str] = set()
        with http_server(data_dir, tmp_path, **env) as server:
            async with mcp_client(server, None) as client:
                first = await call(client, "store_experience", task="Back up the database", experience="pg_dump -Fc")
                acknowledged.add(first["id"])
                ballast = leave_free(disk, MARGIN_MB + ROOM_ABOVE_MARGIN_MB)

                # Write until refused: every write before the refusal is acknowledged, none kills the server.
                message = ""
                for i in range(2000):
                    experience = "x" * EXPERIENCE_CHARS
                    result = await client.call_tool(
                        "store_experience", {"task": task_text(rng, i), "experience": experience}
                    )
                    if result.is_error:
                        message = " ".join(getattr(block, "text", "") for block in result.content)
                        break
                    acknowledged.add(result.structured_content["id"])
                assert f"below min_free_disk_mb={MARGIN_MB}: writes are refused" in message, message
                assert len(acknowledged) > 10  # the disk filled by writes, not from the start
                assert server.proc.poll() is None
                assert free_mb(disk) > MARGIN_MB / 2  # refused before the engine's own room was touched

                # Reads keep working: recall (its bookkeeping uses the other half of the margin), stats, a memory.
                recall = await call(client, "recall_experience", task="Back up the database")
                assert [m["id"] for m in recall["memories"]][:1] == [first["id"]]
                assert (await call(client, "memory_stats"))["memories"] == len(acknowledged)
                await client.read_resource(f"memrl://memories/{first['id']}")
                # A report is a write: refused whole, its recall still reportable once there is room.
                assert "min_free_disk_mb" in await refused(
                    client, "report_outcome", recall_id=recall["recall_id"], reward=1.0
                )
                assert server.proc.poll() is None

                ballast.unlink()  # space freed: writes work again
                report = await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
                assert [c["id"] for c in report["updated"]] == [first["id"]]
                again = await call(client, "store_experience", task=task_text(rng, 9999), experience="after freeing")
                acknowledged.add(again["id"])

        # A restart on the same disk finds every acknowledged memory.
        with http_server(data_dir, tmp_path, **env) as server, anyio.fail_after(60):
            async with mcp_client(server, None) as client:
                assert (await call(client, "memory_stats"))["memories"] == len(acknowledged)
                for memory_id in [*sorted(acknowledged)[:: max(1, len(acknowledged) // 20)], first["id"]]:
                    await client.read_resource(f"memrl://memories/{memory_id}")


@contextmanager
def small_tmpfs(tmp_path: Path, megabytes: int) -> Iterator[Path]:
    """A fresh tmpfs of ``megabytes`` (root): where qdrant-edge's memory-mapped files allocate as they are mapped."""
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(mountpoint)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(f"this test needs root to mount a tmpfs: {result.stderr}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def write_store(embedder: Embedder, data_dir: Path, memories: int, **overrides: Any) -> list[str]:
    """A closed store of ``memories`` memories and a pending recall; returns the memories' ids."""
    service = make_service(embedder, data_dir, **overrides)
    try:
        ids = [
            service.store_experience(NewExperience(task_text(random.Random(i), i), f"lesson {i}"), access=EVERYTHING).id
            for i in range(memories)
        ]
        service.recall(RecallQuery(task_text(random.Random(0), 0)), access=EVERYTHING)
    finally:
        service.close()
    return ids


def exported_ids(data_dir: Path, tmp_path: Path) -> list[str]:
    """``memrl-mcp export`` of the store (its copy goes to ``tmp_path``, another filesystem): the memories' ids."""
    out = tmp_path / "backup.jsonl"
    done = run_cli("export", "--data-dir", str(data_dir), "--out", str(out), env=child_env(TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    return sorted(json.loads(line)["id"] for line in out.read_text().splitlines())


async def assert_served_read_only(data_dir: Path, tmp_path: Path, ids: list[str]) -> None:
    with anyio.fail_after(60):
        env = {"MEMRL_TOOL_PROFILE": "read_only", "TMPDIR": str(tmp_path)}
        async with Client(stdio_server(data_dir, **env)) as client:
            assert (await call(client, "memory_stats"))["memories"] == len(ids)
            found = await call(client, "search_experience", task=task_text(random.Random(0), 0))
            assert found["memories"][0]["id"] == ids[0]  # the first memory, by its own task


@pytest.mark.anyio
async def test_a_restart_on_a_nearly_full_tmpfs_says_so_instead_of_dying_and_reads_go_on(
    embedder: Embedder, tmp_path: Path
) -> None:
    """qdrant-edge allocates its mapped files' holes as it opens them on tmpfs (this store's first reopen needs
    ~150 MB): a page it cannot get used to kill the restarted server with SIGBUS (exit 135)."""
    with small_tmpfs(tmp_path, 320) as disk:
        data_dir = disk / "data"
        ids = write_store(embedder, data_dir, 30)
        ballast = leave_free(disk, 5)

        restart = run_cli("--data-dir", str(data_dir), env=child_env(), timeout=120)
        assert restart.returncode == 2, (restart.returncode, restart.stderr)
        assert "too little for the engine to map its files (a process opening it died of SIGBUS)" in restart.stderr
        assert "MEMRL_TOOL_PROFILE=read_only" in restart.stderr and "memrl-mcp export" in restart.stderr

        assert exported_ids(data_dir, tmp_path) == sorted(ids)  # the full disk is only read
        await assert_served_read_only(data_dir, tmp_path, ids)

        ballast.unlink()  # room again: the same store opens, whole
        with anyio.fail_after(60):
            async with Client(stdio_server(data_dir)) as client:
                assert (await call(client, "memory_stats"))["memories"] == len(ids)


def write_store_with_an_interrupted_report(embedder: Embedder, data_dir: Path) -> list[str]:
    """A closed store of 30 memories whose report of the first one a crash cut after its claim (it is "applying":
    the next writable open finishes it); returns the memories' ids."""
    ids = write_store(embedder, data_dir, 30)
    settings = load_settings(data_dir=data_dir)
    store = open_store(settings.storage, embedder.dim)
    service = MemoryService.open(settings, embedder, store)
    try:
        recall = service.recall(RecallQuery(task_text(random.Random(0), 0)), access=EVERYTHING)
        with pytest.raises(KeyboardInterrupt):
            dying = MemoryService(settings, embedder, DiesAtWrite(store, 1))
            dying.report(OutcomeReport(recall.recall_id, 1.0), access=EVERYTHING)
    finally:
        service.close()
    return ids


@pytest.mark.anyio
async def test_a_restart_on_a_full_ext4_serves_reads_or_says_so_and_export_works(
    embedder: Embedder, tmp_path: Path
) -> None:
    """Below the margin, finishing an interrupted report is a write the disk refuses: the restart used to stop
    there (exit 2, saying "export still works"), and so did export. Now the server starts and reads; with no byte
    left, where the engine cannot open the store, it says so (exit 2); export works either way. Once there is room
    again, the report is finished."""
    with small_disk(tmp_path, DISK_MB) as disk:
        data_dir = disk / "data"
        ids = write_store_with_an_interrupted_report(embedder, data_dir)
        first = task_text(random.Random(0), 0)
        ballast = leave_free(disk, 1)  # below the 64 MB margin

        with anyio.fail_after(60):
            async with Client(stdio_server(data_dir)) as client:
                found = await call(client, "search_experience", task=first)
                assert [(m["id"], m["visits"]) for m in found["memories"][:1]] == [(ids[0], 0)]  # left unfinished
                assert (await call(client, "memory_stats"))["memories"] == len(ids)
                assert "min_free_disk_mb" in await refused(client, "store_experience", task="new", experience="x")
        assert exported_ids(data_dir, tmp_path) == sorted(ids)

        fill = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT)  # then the last blocks, one by one
        for chunk in (4096, 1024, 1):
            with contextlib.suppress(OSError):
                while os.write(fill, b"\0" * chunk):
                    pass
        os.close(fill)
        assert free_mb(disk) == 0
        restart = run_cli("--data-dir", str(data_dir), env=child_env(), timeout=120)
        assert restart.returncode == 2, (restart.returncode, restart.stderr)
        assert "its disk is full" in restart.stderr and "MEMRL_TOOL_PROFILE=read_only" in restart.stderr
        assert exported_ids(data_dir, tmp_path) == sorted(ids)  # "export still works" is now true
        await assert_served_read_only(data_dir, tmp_path, ids)

        ballast.unlink()
        (disk / "fill").unlink()
        with anyio.fail_after(60):
            async with Client(stdio_server(data_dir)) as client:
                found = await call(client, "search_experience", task=first)
                assert [(m["id"], m["visits"]) for m in found["memories"][:1]] == [(ids[0], 1)]


@pytest.mark.anyio
async def test_a_refused_start_on_a_full_tmpfs_takes_no_room_and_the_room_it_names_brings_it_back(
    embedder: Embedder, tmp_path: Path
) -> None:
    """A 256 MB tmpfs, a ballast of 170 MB and min_free_disk_mb 16: memories of 15,000 characters are written until
    the margin refuses them, and the store is closed. A restart needs the room its indexes and in-RAM vectors take
    once mapped (~140 MB here), and is refused: it used to leave the tmpfs 100% full (the pages its probe had
    allocated), so that even a freed disk was taken again by the next refused restart. Now a refused restart takes
    no room, says how much the store needs, and with exactly that much free the store opens writable."""
    margin = {"MEMRL_MIN_FREE_DISK_MB": "16"}
    with small_tmpfs(tmp_path, 256) as disk:
        data_dir = disk / "data"
        ballast = leave_free(disk, 86)
        service = make_service(embedder, data_dir, min_free_disk_mb=16)
        stored = 0
        try:
            while True:
                rng = random.Random(stored)
                experience = " ".join(rng.randbytes(4).hex() for _ in range(EXPERIENCE_CHARS // 9))
                service.store_experience(NewExperience(task_text(rng, stored), experience), access=EVERYTHING)
                stored += 1
        except DiskFullError:
            pass
        finally:
            service.close()
        assert stored > 500  # filled by writes

        needs = []
        for _ in range(2):  # a second refused restart finds the same room, and takes none either
            before = free_mb(disk)
            restart = run_cli("--data-dir", str(data_dir), env=child_env(**margin), timeout=120)
            assert restart.returncode == 2, (restart.returncode, restart.stderr)
            assert "too little for the engine to map its files" in restart.stderr, restart.stderr
            assert free_mb(disk) >= before - 0.5, (before, free_mb(disk), restart.stderr)
            room = re.search(r"opening it writable needs about (\d+) MB free", restart.stderr)
            assert room is not None, restart.stderr
            needs.append(int(room[1]))
        assert needs[0] == needs[1] > 100

        ballast.unlink()
        ballast = leave_free(disk, needs[0])  # exactly the room the message named
        with anyio.fail_after(120):
            async with Client(stdio_server(data_dir, **margin)) as client:
                assert (await call(client, "memory_stats"))["memories"] == stored
                await call(client, "store_experience", task="after the room was made", experience="writable again")
        print(f"{stored} memories: refused restarts took no room; opened writable with {needs[0]} MB free, "
              f"{free_mb(disk):.1f} MB left")  # fmt: skip
