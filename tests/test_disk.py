"""A full disk never kills the server nor loses what it acknowledged (issue 11.8), on a real small filesystem.

qdrant-edge writes through memory-mapped files; on a full disk the page it cannot allocate used to kill the server
with SIGBUS mid-stream. Here a loop-mounted ext4 image (root: ``mount -o loop``) holds the store, a ballast file
leaves a little room, and the real HTTP server is written to until it refuses: writes must be refused with the
message before a crash, reads must keep working, writes must work again once space is freed, and every
acknowledged memory must be there after a restart on the same disk.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from tests.conftest import call, refused
from tests.test_http import mcp_client
from tests.test_transports import http_server

DISK_MB, MARGIN_MB, ROOM_ABOVE_MARGIN_MB = 96, 8, 3
EXPERIENCE_CHARS = 15_000  # a long experience: the disk fills in a few hundred writes
WORDS = ("parse", "rotate", "index", "backup", "deploy", "compile", "join", "filter", "migrate", "cache", "render")


@contextmanager
def small_disk(tmp_path: Path, megabytes: int) -> Iterator[Path]:
    """A fresh ext4 filesystem of ``megabytes``, loop-mounted (no reserved blocks: free space is what df shows)."""
    image, mountpoint = tmp_path / "disk.img", tmp_path / "disk"
    mountpoint.mkdir()
    with image.open("wb") as file:
        file.truncate(megabytes << 20)
    for command in (
        ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
        ["mount", "-o", "loop", str(image), str(mountpoint)],
    ):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.fail(f"this test needs root and loop devices ({' '.join(command)}): {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


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
