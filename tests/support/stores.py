"""Stores as older versions wrote them, and small filesystems to fill."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from memrl_mcp.memory.records import memory_payload
from memrl_mcp.models import MemoryView
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, new_id, open_store

ENGINES = ("edge", pytest.param("qdrant-local", marks=pytest.mark.slow))
"""The embedded engines, for ``@pytest.mark.parametrize("engine", ENGINES)``: qdrant-client's local mode is the
fallback, left to the full suite (tests/conftest.py)."""
TASKS = ("heat the mug in the microwave", "list the files larger than 10MB under /var/log", "count rows per region")


def old_payload(namespace: str, task: str, q: float = 0.25) -> dict[str, Any]:
    """A memory as stores written before the bookkeeping of optimistic writes held it: no version, no applied."""
    memory = MemoryView(
        id=new_id(),
        namespace=namespace,
        task=task,
        experience=f"how to {task}",
        outcome="success",
        q=q,
        visits=2,
        last_reward=1.0,
        merges=0,
        created_at=1.7e9,
        updated_at=1.7e9,
        metadata={},
    )
    payload = memory_payload(memory)
    del payload["version"], payload["applied"]
    return payload


def write_old_store(data_dir: Path, engine: str, points: list[Point]) -> None:
    store = open_store(load_settings(data_dir=data_dir, embedded_engine=engine).storage, 384)
    for start in range(0, len(points), 1000):
        store.upsert("memories", points[start : start + 1000])
    store.close()


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
