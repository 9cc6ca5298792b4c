"""``memrl-mcp export`` and ``memrl-mcp import`` as real processes on real embedded stores.

Stores are seeded in this process through the service's own loop (store, recall, report), closed, then
exported and imported by ``memrl-mcp`` children, exactly as a user would run them.
"""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path
from typing import BinaryIO

import pytest

from memrl_mcp.cli import parse_args
from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.archive import import_memories, restore, write_records
from memrl_mcp.memory.records import step_id
from memrl_mcp.models import MemoryView, StepRecordView
from memrl_mcp.requests import NewExperience, OutcomeReport, RecallQuery, StepQuery, TrajectoryReport
from memrl_mcp.settings import load_settings
from memrl_mcp.storage.files import write_atomically
from memrl_mcp.validation import TrajectoryStep
from tests.support.mcp import make_service
from tests.support.servers import child_env, run_cli
from tests.support.stores import ENGINES

CSV_TASK = "Sort a CSV file by its second column and write the result to a new file"
PNG_TASK = "Resize a PNG image to 64x64 pixels"
README_TASK = "Traduire le README en 日本語 🚀 sans casser le Markdown"


def seed(embedder: Embedder, data_dir: Path, engine: str = "edge") -> dict[str, MemoryView]:
    """Two namespaces, successes and failures, learned Q from reports, a merge, unicode and nested metadata."""
    service = make_service(embedder, data_dir, engine)
    try:
        metadata = {"source": "tests", "nested": {"tags": ["ü", "日本語", "🚀"], "values": [1, 2.5, None, True]}}
        service.store_experience(
            NewExperience(CSV_TASK, "1. csv.reader 2. sort by r[1] 3. csv.writer", metadata=metadata), access=EVERYTHING
        )
        merged = service.store_experience(
            NewExperience(CSV_TASK, "1. CSV.reader  2. sort by r[1]  3. csv.writer", metadata={"v": 2}),
            access=EVERYTHING,
        )
        assert merged.merged
        service.store_experience(
            NewExperience(CSV_TASK, "Sorting the column as text put 10 before 9.", outcome="failure"), access=EVERYTHING
        )
        service.store_experience(
            NewExperience(README_TASK, "Glossaire d'abord, puis section par section.", namespace="team", q=1 / 3),
            access=EVERYTHING,
        )
        service.store_experience(
            NewExperience(PNG_TASK, "Image.thumbnail keeps the aspect ratio: not 64x64.", "team", "failure"),
            access=EVERYTHING,
        )
        for task, namespace, reward in ((CSV_TASK, None, 1.0), (CSV_TASK, None, 0.7), (PNG_TASK, "team", -0.45)):
            service.report(
                OutcomeReport(
                    service.recall(RecallQuery(task, namespace=namespace), access=EVERYTHING).recall_id, reward
                ),
                access=EVERYTHING,
            )
        memories = {m.id: m for m in service.memories()}
    finally:
        service.close()
    assert len(memories) == 4
    assert any(m.merges == 1 and m.visits == 2 and m.q not in (0.0, 0.3) for m in memories.values())
    assert {m.namespace for m in memories.values()} == {"default", "team"}
    return memories


def stored(embedder: Embedder, data_dir: Path, engine: str = "edge") -> dict[str, MemoryView]:
    service = make_service(embedder, data_dir, engine)
    try:
        return {m.id: m for m in service.memories()}
    finally:
        service.close()


def parse(lines: list[str]) -> dict[str, MemoryView]:
    return {m.id: m for m in (MemoryView.model_validate_json(line) for line in lines)}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_bytes(b"".join(line.encode() + b"\n" for line in lines))
    return path


def memory_line(memory: MemoryView, **changes: object) -> str:
    return json.dumps({**memory.model_dump(), **changes}, ensure_ascii=False)


@pytest.mark.slow  # the CLI in a child process
@pytest.mark.parametrize("engine", ENGINES)
def test_export_import_export_round_trip(embedder: Embedder, tmp_path: Path, engine: str) -> None:
    original = seed(embedder, tmp_path / "a", engine)
    env = child_env(MEMRL_EMBEDDED_ENGINE=engine)
    out = tmp_path / "backup.jsonl"

    first = run_cli("export", "--out", str(out), "--data-dir", str(tmp_path / "a"), env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""
    assert f"exported 4 memories (default 2, team 2) from {tmp_path / 'a'} to {out}" in first.stderr
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["backup.jsonl"]  # no temporary file left
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    text = out.read_text(encoding="utf-8")
    assert "日本語" in text  # UTF-8, not \u escapes
    lines = text.splitlines()
    assert all("vector" not in json.loads(line) for line in lines)
    assert parse(lines) == original  # every field, floats exactly

    imported = run_cli("import", str(out), "--data-dir", str(tmp_path / "b"), env=env)
    assert imported.returncode == 0, imported.stderr
    assert f"imported 4 memories (default 2, team 2) into {tmp_path / 'b'}" in imported.stderr

    # Store options before the subcommand work too; no --out writes to stdout.
    second = run_cli("--data-dir", str(tmp_path / "b"), "export", env=env)
    assert second.returncode == 0, second.stderr
    assert sorted(second.stdout.splitlines()) == sorted(lines)

    service = make_service(embedder, tmp_path / "b", engine)
    try:
        assert {m.id: m for m in service.memories()} == original
        # The tasks were re-embedded: recall finds each memory by its task, in its namespace.
        for memory in original.values():
            recall = service.recall(RecallQuery(memory.task, namespace=memory.namespace), access=EVERYTHING)
            found = {m.id: m.similarity for m in recall.memories}
            assert found[memory.id] > 0.99
    finally:
        service.close()


@pytest.mark.slow  # the CLI in a child process
def test_export_of_chosen_namespaces(embedder: Embedder, tmp_path: Path) -> None:
    original = seed(embedder, tmp_path / "data")
    team = {i: m for i, m in original.items() if m.namespace == "team"}
    args = ("export", "--namespace", "team", "--namespace", "team", "--namespace", "nobody")
    result = run_cli(*args, "--data-dir", str(tmp_path / "data"), env=child_env())
    assert result.returncode == 0, result.stderr
    assert parse(result.stdout.splitlines()) == team
    assert "exported 2 memories (team 2)" in result.stderr
    assert "no memory in namespace 'nobody'" in result.stderr


@pytest.mark.slow  # the CLI in a child process
def test_export_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "backup.jsonl"
    result = run_cli("export", "--out", str(out), "--data-dir", str(tmp_path / "typo"), env=child_env())
    assert result.returncode == 2
    assert f"no memory store in {tmp_path / 'typo'}" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the CLI in a child process
def test_malformed_lines_are_all_named_and_nothing_is_written(embedder: Embedder, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    original = seed(embedder, data_dir)
    existing, other = list(original.values())[:2]
    overwrite = memory_line(existing, experience="must not be written")
    fields = existing.model_dump()
    del fields["q"]
    malformed = tmp_path / "malformed.jsonl"
    write_lines(
        malformed,
        [
            overwrite,  # valid: would replace a stored memory
            "",
            '{"id": "x", "task": ',
            "[1, 2]",
            json.dumps(fields),
            memory_line(other, vector=[0.1, 0.2]),
            memory_line(other, visits="3", last_reward="high"),
            memory_line(existing, q=0.25),
        ],
    )
    with malformed.open("ab") as stream:
        stream.write(b'{"task": "caf\xe9"}\n')

    out_of_limits = tmp_path / "limits.jsonl"
    write_lines(
        out_of_limits,
        [
            overwrite,
            memory_line(other, q=1.5),
            memory_line(other, id="not-a-uuid"),
            memory_line(other, id="7b0f6c55-6f1e-4c53-9c1b-0a4f8f1f5a01", namespace="no spaces"),
            memory_line(other, id="0c9a3b8e-3d43-4f0e-8f4e-64f3f0a0e3b2", task="   "),
            memory_line(other, id="5d1c2f43-9a4f-4d67-8a6e-1c1f9a7e3b54", last_reward=math.nan),
            memory_line(other, id="e2b7a6f1-1c3d-4f5e-9a8b-7c6d5e4f3a21", metadata={"blob": "x" * 5000}),
        ],
    )

    expected = {
        malformed: [
            "line 3: not JSON (Expecting value at column 21)",
            "line 4: not a JSON object but list",
            "line 5: q: missing",
            "line 6: vector: unknown field",
            "line 7: visits: Input should be a valid integer, got '3'; last_reward: ",
            f"line 8: id: {existing.id} is already on line 1",
            "line 9: not UTF-8",
        ],
        out_of_limits: [
            "line 2: q: Input should be less than or equal to 1, got 1.5",
            "line 3: id: is not a UUID, got 'not-a-uuid'",
            "line 4: namespace: String should match pattern '^[A-Za-z0-9_.:-]{1,64}$', got 'no spaces'",
            "line 5: task: must contain a visible character",
            "line 6: last_reward: Input should be a finite number, got nan",
            "line 7: metadata: ",
        ],
    }
    for path, messages in expected.items():
        result = run_cli("import", str(path), "--data-dir", str(data_dir), env=child_env())
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        assert f"{len(messages)} bad line(s), nothing imported" in result.stderr
        for message in messages:
            assert message in result.stderr
        assert "line 1:" not in result.stderr  # the valid line is not blamed
    assert stored(embedder, data_dir) == original


@pytest.mark.slow  # the CLI in a child process
def test_import_completes_an_interrupted_one_and_keeps_other_memories(embedder: Embedder, tmp_path: Path) -> None:
    """A crash mid-import leaves some memories of the file written: running the import again completes it."""
    original = seed(embedder, tmp_path / "source")
    backup = tmp_path / "backup.jsonl"
    with backup.open("wb") as stream:
        write_records(original.values(), stream)
    backup.write_bytes(b"\n \r\n" + backup.read_bytes().replace(b"\n", b"\r\n\n"))  # blank lines, CRLF: skipped

    target = make_service(embedder, tmp_path / "target")
    try:
        first, second = list(original.values())[:2]
        restore(target, [first, second.model_copy(update={"q": -0.9, "experience": "stale"})])  # the crashed run
        # As stored: qdrant-edge may move a float by an ulp on its first write (a fixed point from then on).
        elsewhere = target.store_experience(
            NewExperience(PNG_TASK, "Image.resize((64, 64))", namespace="elsewhere"), access=EVERYTHING
        )
        detail = target.get(elsewhere.id, access=EVERYTHING)
        kept = MemoryView.model_validate(detail.model_dump(exclude={"history"}))  # a backup holds no Q history
    finally:
        target.close()

    result = run_cli("import", str(backup), "--data-dir", str(tmp_path / "target"), env=child_env())
    assert result.returncode == 0, result.stderr
    assert "imported 4 memories (default 2, team 2)" in result.stderr
    assert stored(embedder, tmp_path / "target") == {**original, kept.id: kept}


@pytest.mark.slow  # the CLI in a child process
def test_a_held_store_is_refused(embedder: Embedder, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    original = seed(embedder, data_dir)
    backup = tmp_path / "backup.jsonl"
    with backup.open("wb") as stream:
        write_records(original.values(), stream)
    holder = make_service(embedder, data_dir)  # as a running server would
    try:
        for args in (("import", str(backup)), ("export", "--out", str(tmp_path / "out.jsonl"))):
            result = run_cli(*args, "--data-dir", str(data_dir), env=child_env())
            assert result.returncode == 2
            assert result.stdout == ""
            assert "Traceback" not in result.stderr
            assert "already open in another process" in result.stderr
            assert str(data_dir) in result.stderr
        assert not (tmp_path / "out.jsonl").exists()
    finally:
        holder.close()


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "backup.jsonl"
    target.write_text("the previous backup\n")

    def crash(stream: BinaryIO) -> None:
        stream.write(b'{"id": "half a line')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, crash)
    assert target.read_text() == "the previous backup\n"
    assert list(tmp_path.iterdir()) == [target]

    assert write_atomically(target, lambda stream: stream.write(b"new\n")) == 4
    assert target.read_text() == "new\n"
    assert list(tmp_path.iterdir()) == [target]


def test_serving_stays_the_default_command() -> None:
    serve = parse_args(["--transport", "streamable-http", "--port", "9000", "--data-dir", "d"])
    assert (serve.command, serve.transport, serve.port, serve.data_dir) == (None, "streamable-http", 9000, "d")
    before = parse_args(["--data-dir", "d", "--config", "c.yaml", "export"])
    assert (before.command, before.data_dir, before.config, before.out, before.namespace) == (
        "export",
        "d",
        "c.yaml",
        None,
        [],
    )
    after = parse_args(["import", "f.jsonl", "--data-dir", "d"])
    assert (after.command, str(after.file), after.data_dir) == ("import", "f.jsonl", "d")


STEPS = [
    TrajectoryStep(
        observation="You are in the kitchen. You see a fridge 1 and a countertop 1.",
        action="go to fridge 1",
        reward=0.0,
    ),
    TrajectoryStep(observation="The fridge 1 is closed.", action="open fridge 1", reward=0.0),
    TrajectoryStep(observation="You open the fridge 1. In it, you see an apple 1.", action="take apple 1", reward=1.0),
]


def seed_steps(embedder: Embedder, data_dir: Path, engine: str) -> dict[str, StepRecordView]:
    """Memories (seed) and learned step records in two namespaces, one record with two actions."""
    seed(embedder, data_dir, engine)
    service = make_service(embedder, data_dir, engine)
    try:
        for episode, namespace in (("e1", "default"), ("e2", "team"), ("e3", "team")):
            steps = STEPS if episode != "e3" else [STEPS[0].model_copy(update={"action": "look", "reward": -0.5})]
            service.report_trajectory(
                TrajectoryReport("cool an apple", steps, episode, namespace=namespace), access=EVERYTHING
            )
        return {r.id: r for r in service.step_records()}
    finally:
        service.close()


@pytest.mark.slow  # the CLI in a child process
@pytest.mark.parametrize("engine", ENGINES)
def test_steps_round_trip_with_the_memories(embedder: Embedder, tmp_path: Path, engine: str) -> None:
    steps = seed_steps(embedder, tmp_path / "a", engine)
    assert len(steps) == 6 and any(len(r.actions) == 2 for r in steps.values())
    env = child_env(MEMRL_EMBEDDED_ENGINE=engine)
    out = tmp_path / "backup.jsonl"
    exported = run_cli("export", "--out", str(out), "--data-dir", str(tmp_path / "a"), env=env)
    assert exported.returncode == 0, exported.stderr
    assert "exported 4 memories (default 2, team 2) and 6 step records (default 3, team 3)" in exported.stderr
    kinds = [json.loads(line)["kind"] for line in out.read_text().splitlines()]
    assert kinds == ["memory"] * 4 + ["step"] * 6

    imported = run_cli("import", str(out), "--data-dir", str(tmp_path / "b"), env=env)
    assert imported.returncode == 0, imported.stderr
    assert "imported 4 memories (default 2, team 2) and 6 step records (default 3, team 3)" in imported.stderr
    service = make_service(embedder, tmp_path / "b", engine)
    try:
        assert {r.id: r for r in service.step_records()} == steps
        # Re-embedded: the advice finds each record by its task and observation, and reports land on them.
        advice = service.recall_step_advice(StepQuery("cool an apple", STEPS[2].observation, k=1), access=EVERYTHING)
        assert advice.records[0].observation_similarity == pytest.approx(1.0, abs=1e-5)
        assert [a.action for a in advice.encouraged] == ["take apple 1"]
        report = service.report_trajectory(TrajectoryReport("cool an apple", STEPS, "e4"), access=EVERYTHING)
        assert (report.created, report.merged) == (0, 3)
    finally:
        service.close()


@pytest.mark.slow  # the CLI in a child process
def test_malformed_step_lines_are_named_and_nothing_is_written(embedder: Embedder, tmp_path: Path) -> None:
    steps = seed_steps(embedder, tmp_path / "data", "edge")
    record = next(r for r in steps.values() if len(r.actions) == 2)

    def line(namespace: str = record.namespace, **changes: object) -> str:
        """A step line in its own namespace, under the id derived from it (unless the change is the id)."""
        fields = {**record.model_dump(), "namespace": namespace, **changes}
        derived = step_id(namespace, record.task, str(fields["observation"]))
        return json.dumps({"kind": "step", **fields, "id": changes.get("id", derived)})

    action = record.actions[0].model_dump()
    malformed = [  # refused as the file is read
        line(),  # valid
        json.dumps({"kind": "episode", **record.model_dump()}),
        line("n3", actions=[{**action, "extra": 1}]),
    ]
    out_of_limits = [  # refused by the memory's own checks
        line(),
        line("n2", id="0c9a3b8e-3d43-4f0e-8f4e-64f3f0a0e3b2"),
        line("n3", actions=[{**action, "q": math.nan}]),
        line("n4", actions=[{**action, "visits": -1}]),
        line("n5", actions=[action, action]),
        line("n6", actions=[{**action, "action": f"a{i}"} for i in range(11)]),
        line("n7", observation="x" * 8001),
    ]
    expected = {
        "malformed": (
            malformed,
            ["line 2: kind: must be one of 'memory', 'step', got 'episode'", "line 3: actions[0].extra: no such field"],
        ),
        "limits": (
            out_of_limits,
            [
                "line 2: id: is not the id of its (namespace, task, observation)",
                "line 3: actions[0].q: Input should be a finite number",
                "line 4: actions[0].visits: Input should be greater than or equal to 0",
                "line 5: actions: an action is listed twice",
                "line 6: actions: 11 exceed step_max_actions=10",
                "line 7: observation: String should have at most 8000 characters",
            ],
        ),
    }
    for name, (lines, messages) in expected.items():
        path = write_lines(tmp_path / f"{name}.jsonl", lines)
        result = run_cli("import", str(path), "--data-dir", str(tmp_path / "data"), env=child_env())
        assert result.returncode == 2, result.stderr
        for message in messages:
            assert message in result.stderr
        assert f"{len(messages)} bad line(s), nothing imported" in result.stderr and "line 1:" not in result.stderr
    service = make_service(embedder, tmp_path / "data")
    try:
        assert {r.id: r for r in service.step_records()} == steps
    finally:
        service.close()


def test_an_export_of_an_earlier_version_imports(embedder: Embedder, tmp_path: Path) -> None:
    """Its memories lack ``experience_source`` (issue 26 added it): they import, with no source, as a store written
    before it reads."""
    original = seed(embedder, tmp_path / "data")
    earlier = tmp_path / "earlier.jsonl"
    lines = [m.model_dump(exclude={"experience_source"}) for m in original.values()]
    earlier.write_text("".join(json.dumps(line) + "\n" for line in lines))
    import_memories(load_settings(data_dir=tmp_path / "restored"), earlier)
    service = make_service(embedder, tmp_path / "restored")
    try:
        restored = {m.id: m for m in service.memories()}
    finally:
        service.close()
    assert restored == {i: m.model_copy(update={"experience_source": None}) for i, m in original.items()}
