"""A read-only server offers lookups only and changes no byte of its store, even on a read-only volume; every server
says which constants it runs with."""

import hashlib
import json
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery, TrajectoryReport
from memrl_mcp.settings import load_settings
from memrl_mcp.storage import Point, StoreLockedError, new_id, open_store
from memrl_mcp.storage.migrations import SCHEMA_VERSION
from memrl_mcp.surface.server import create_server
from memrl_mcp.validation import TrajectoryStep
from tests.support.crashes import DiesAtWrite
from tests.support.mcp import call, make_service, resource_text
from tests.support.servers import DEADLINE_S, base_url, child_env, http_server, run_cli, stdio_server
from tests.support.stores import TASKS, old_payload, small_disk, write_old_store


@pytest.mark.anyio
async def test_a_read_only_server_offers_no_tool_that_writes(embedder: Embedder, tmp_path: Path) -> None:
    writer = make_service(embedder, tmp_path / "data")
    async with Client(create_server(writer)) as client:
        stored = await call(client, "store_experience", task="water the plants", experience="use the blue can")
    writer.close()

    reader = make_service(embedder, tmp_path / "data", tool_profile="read_only")
    try:
        async with Client(create_server(reader)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"search_experience", "memory_stats", "recall_step_advice", "list_memories"}
            for tool, arguments in {
                "recall_experience": {"task": "water the plants"},  # it would log a recall
                "store_experience": {"task": "a new task", "experience": "a new lesson"},
                "report_outcome": {"recall_id": stored["id"], "reward": 1.0},
                "forget_experience": {"memory_id": stored["id"]},
                "report_trajectory": {
                    "task": "water the plants",
                    "steps": [{"observation": "a dry plant", "action": "water it", "reward": 1.0}],
                    "episode_id": "e1",
                },
            }.items():
                result = await client.call_tool(tool, arguments)
                assert result.is_error, tool
            found = await call(client, "search_experience", task="water the plants")
            assert [m["id"] for m in found["memories"]] == [stored["id"]]
            stats = await call(client, "memory_stats")
            assert (stats["memories"], stats["recalls_pending"]) == (1, 0)
    finally:
        reader.close()


@pytest.mark.anyio
async def test_the_settings_resource_gives_the_effective_constants(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path / "data", k1=10, k2=5, epsilon=0.01, q_init_success=0.5)
    try:
        async with Client(create_server(service)) as client:
            resource = await client.read_resource("memrl://settings")
            settings = json.loads(resource_text(resource))
    finally:
        service.close()
    assert (settings["k1"], settings["k2"], settings["epsilon"], settings["q_init_success"]) == (10, 5, 0.01, 0.5)
    # The embedder's own thresholds, since none was set.
    profile = embedder.similarity
    assert (settings["delta"], settings["sim_mean"], settings["sim_std"]) == (profile.delta, profile.mean, profile.std)
    assert settings["merge_threshold"] == profile.merge and settings["tool_profile"] == "full"


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and folder under ``folder``: (size, modification time, SHA-256 of the content)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        found[str(path.relative_to(folder))] = (stat.st_size if path.is_file() else 0, stat.st_mtime_ns, digest)
    return found


def write_store_with_an_interrupted_report(embedder: Embedder, data_dir: Path, engine: str) -> str:
    """A store holding memories, a step record, an episode, and a report that a crash cut after its claim (what a
    writable open would finish); returns the memory's id."""
    settings = load_settings(data_dir=data_dir, embedded_engine=engine)
    store = open_store(settings.storage, embedder.dim)
    writer = MemoryService.open(settings, embedder, store)
    try:
        memory = writer.store_experience(NewExperience("water the plants", "use the blue can"), access=EVERYTHING)
        step = TrajectoryStep(observation="a dry plant", action="water it", reward=1.0)
        writer.report_trajectory(TrajectoryReport("water the plants", [step], "e1"), access=EVERYTHING)
        recall = writer.recall(RecallQuery("water the plants"), access=EVERYTHING)
        dying = MemoryService(settings, embedder, DiesAtWrite(store, 1))
        with pytest.raises(KeyboardInterrupt):
            dying.report(OutcomeReport(recall.recall_id, 1.0, experience="rain water is better"), access=EVERYTHING)
    finally:
        writer.close()
    return memory.id


@pytest.mark.anyio
async def test_a_read_only_server_changes_no_byte_of_the_store(embedder: Embedder, tmp_path: Path, engine: str) -> None:
    """Not at open (no migration, no recovery, no engine write), not while serving, not at close."""
    data_dir = tmp_path / "data"
    memory_id = write_store_with_an_interrupted_report(embedder, data_dir, engine)
    before = snapshot(data_dir)

    reader = make_service(embedder, data_dir, engine, tool_profile="read_only")
    try:
        async with Client(create_server(reader)) as client:
            found = await call(client, "search_experience", task="water the plants")
            assert [m["id"] for m in found["memories"]] == [memory_id]
            assert found["memories"][0]["visits"] == 0  # the interrupted report is left as it stands
            assert (await call(client, "memory_stats"))["memories"] == 1
            assert (await call(client, "list_memories"))["total"] == 1
            advice = await call(client, "recall_step_advice", task="water the plants", observation="a dry plant")
            assert [a["action"] for a in advice["encouraged"]] == ["water it"]
            await client.read_resource(f"memrl://memories/{memory_id}")
    finally:
        reader.close()
    assert snapshot(data_dir) == before

    writer = make_service(embedder, data_dir, engine)  # a writable open still finishes the report
    try:
        assert writer.get(memory_id, access=EVERYTHING).visits == 1
    finally:
        writer.close()


def test_a_read_only_open_of_a_store_a_server_holds_is_refused(embedder: Embedder, tmp_path: Path) -> None:
    """The copy is made under the engine's own locks: never a copy torn by a writer."""
    writer = make_service(embedder, tmp_path / "data")
    try:
        with pytest.raises(StoreLockedError, match="already open in another process"):
            make_service(embedder, tmp_path / "data", tool_profile="read_only")
    finally:
        writer.close()


@pytest.mark.slow  # mounts a filesystem
@pytest.mark.anyio
async def test_a_store_on_a_read_only_volume_is_served_read_only_and_exported(
    embedder: Embedder, tmp_path: Path
) -> None:
    with small_disk(tmp_path, 160) as disk:
        data_dir = disk / "data"
        memory_id = write_store_with_an_interrupted_report(embedder, data_dir, "edge")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)

        refused_start = run_cli("--data-dir", str(data_dir), env=child_env())
        assert refused_start.returncode == 2, refused_start.stderr
        assert "cannot be written" in refused_start.stderr and "MEMRL_TOOL_PROFILE=read_only" in refused_start.stderr

        with anyio.fail_after(DEADLINE_S):
            async with Client(stdio_server(data_dir, MEMRL_TOOL_PROFILE="read_only")) as client:
                found = await call(client, "search_experience", task="water the plants")
                assert [m["id"] for m in found["memories"]] == [memory_id]
                assert (await call(client, "memory_stats"))["steps"] == 1

        backup = tmp_path / "backup.jsonl"
        exported = run_cli("export", "--data-dir", str(data_dir), "--out", str(backup), env=child_env())
        assert exported.returncode == 0, exported.stderr
        lines = [json.loads(line) for line in backup.read_text().splitlines()]
        assert [(line["kind"], line["id"]) for line in lines if line["kind"] == "memory"] == [("memory", memory_id)]


@pytest.mark.slow  # the CLI in a child process
def test_a_read_only_server_refuses_a_store_that_needs_a_migration(embedder: Embedder, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    point = Point(new_id(), embedder.embed([TASKS[0]])[0], old_payload("team", TASKS[0]))
    write_old_store(data_dir, "edge", [point])
    before = snapshot(data_dir)
    done = run_cli("--data-dir", str(data_dir), env=child_env(MEMRL_TOOL_PROFILE="read_only"), timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"schema version 0 and needs a migration to version {SCHEMA_VERSION}" in done.stderr
    assert "bookkeeping (to version 1), history_as_text (to version 2)" in done.stderr
    assert "a read-only server writes nothing" in done.stderr
    assert snapshot(data_dir) == before


@pytest.mark.slow  # a server process
def test_the_inspector_of_a_read_only_server_refuses_edits_naming_the_setting(
    embedder: Embedder, tmp_path: Path
) -> None:
    """An operator who tries to correct a memory in /ui is told which setting makes the server read-only (the old
    ``read_only: true`` is refused at start: tests/test_agent_surface.py), and nothing changes."""
    data_dir = tmp_path / "data"
    memory_id = write_store_with_an_interrupted_report(embedder, data_dir, "edge")
    before = snapshot(data_dir)
    with http_server(data_dir, tmp_path, MEMRL_TOOL_PROFILE="read_only") as server:
        memory = f"{base_url(server)}/ui/api/memories/{memory_id}"
        for method, body in (("PATCH", {"experience": "rain water is better"}), ("DELETE", {})):
            answer = httpx.request(method, memory, json=body, timeout=DEADLINE_S)
            assert answer.status_code == 403, answer.text
            assert answer.json() == {
                "error": "read_only",
                "error_description": "this server is read-only (tool_profile: read_only): nothing can change",
            }
        assert httpx.get(memory, timeout=DEADLINE_S).json()["experience"] == "use the blue can"
    assert snapshot(data_dir) == before
