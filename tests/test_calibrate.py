"""``memrl-mcp calibrate`` through the CLI, with the real default embedder, on task texts these tests write in the
style of the benchmarks' (household goals, questions about a database): the calibration's rules hold for any texts,
and the tests need no benchmark data beside the clone."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from memrl_mcp import cli
from memrl_mcp.embeddings import Embedder
from memrl_mcp.embeddings.calibrate import MIN_TASKS, same_task_key
from memrl_mcp.embeddings.minilm import MINILM_FOLDER
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience
from memrl_mcp.settings import load_settings

THINGS: tuple[str, ...] = ("mug", "apple", "egg", "potato", "tomato", "bread", "lettuce", "bowl", "plate", "pan")
THINGS += ("knife", "spoon", "book", "pencil", "cellphone", "keychain", "vase", "candle", "soapbar", "towel")
PLACES = ("countertop", "cabinet", "drawer", "fridge", "shelf", "desk", "sidetable", "diningtable", "dresser", "safe")
CHORES = (
    "put a {} in {}.",
    "clean some {} and put it in {}.",
    "heat some {} and put it in {}.",
    "cool some {} and put it in {}.",
    "put two {} in {}.",
)
TABLES = ("employees", "orders", "customers", "products", "invoices", "shipments", "students", "books")
COLUMNS = ("price", "status", "created_at", "region", "quantity")
QUESTIONS = (
    "How many rows of the {} table have no {}?",
    "List every {1} of the {0} table, largest first.",
    "Delete the rows of {} whose {} is older than 2020.",
    "In {}, set {} to zero wherever it is negative.",
    "What is the average {1} in the {0} table?",
)


def household_goals() -> list[str]:
    """120 distinct goals: each thing in five chores (each at its own place) and under the desk lamp."""
    goals = [
        chore.format(thing, PLACES[(i * len(CHORES) + j) % len(PLACES)])
        for i, thing in enumerate(THINGS)
        for j, chore in enumerate(CHORES)
    ]
    return goals + [f"look at {thing} under the desklamp." for thing in THINGS]


def database_questions(count: int) -> list[str]:
    """Up to 40 distinct questions: each table asked each question, about one of its columns."""
    questions = [
        question.format(table, COLUMNS[(i + j) % len(COLUMNS)])
        for j, question in enumerate(QUESTIONS)
        for i, table in enumerate(TABLES)
    ]
    return questions[:count]


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli.main(["calibrate", "--data-dir", str(tmp_path / "data"), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_calibrate_a_task_file_writes_settings_that_follow_the_documented_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, embedder: Embedder
) -> None:
    goals = household_goals()
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("\n".join(goals + goals[:10]) + "\n\n")  # repeats and blank lines are ignored
    out_file = tmp_path / "memrl.yaml"
    status, out, err = run(capsys, tmp_path, "--tasks", str(tasks), "--out", str(out_file))
    assert (status, out) == (0, ""), err
    assert f"wrote {out_file}" in err
    text = out_file.read_text()
    assert f"embedder all-MiniLM-L6-v2-int8, {len(goals)} distinct tasks from {tasks}" in text
    found = yaml.safe_load(text)["similarity"]
    assert set(found) == {"delta", "sim_mean", "sim_std", "merge_threshold"}

    # The file is a settings file the server accepts as it is.
    similarity = load_settings(out_file, environ={}, data_dir=tmp_path).similarity
    assert (similarity.delta, similarity.merge_threshold) == (found["delta"], found["merge_threshold"])

    vectors = embedder.embed(goals)
    sims = vectors @ vectors.T
    off = ~np.eye(len(goals), dtype=bool)
    assert found["sim_mean"] == pytest.approx(sims[off].mean(), abs=5e-4)
    assert found["sim_std"] == pytest.approx(sims[off].std(), abs=5e-4)
    nearest = np.where(off, sims, -1).max(axis=1)
    assert np.mean(nearest >= found["delta"]) >= 0.95  # delta keeps 95% of nearest neighbours...
    assert np.mean(nearest >= found["delta"] + 0.05) < 0.95  # ...and is the largest 0.05 step that does
    keys = np.array([same_task_key(g) for g in goals])
    different = keys[:, None] != keys[None, :]
    assert sims[different].max() < found["merge_threshold"] <= sims[different].max() + 0.01


def test_json_lines_and_plain_lines_give_the_same_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tasks = database_questions(40)
    plain, jsonl = tmp_path / "tasks.txt", tmp_path / "tasks.jsonl"
    plain.write_text("\n".join(tasks))
    jsonl.write_text("".join(json.dumps({"task": t, "namespace": "db", "q": 0.5}) + "\n" for t in tasks))
    results = []
    for path in (plain, jsonl):
        status, out, err = run(capsys, tmp_path, "--tasks", str(path))
        assert status == 0, err
        results.append(yaml.safe_load(out))
    assert results[0] == results[1]


def test_calibrate_a_namespace_of_the_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, embedder: Embedder
) -> None:
    goals = household_goals()
    service = MemoryService.open(load_settings(data_dir=tmp_path / "data"), embedder)
    try:
        for goal in goals[:25]:
            service.store_experience(NewExperience(goal, "did it", namespace="kitchen"), access=EVERYTHING)
        for goal in goals[25:60]:
            service.store_experience(NewExperience(goal, "did it", namespace="garden"), access=EVERYTHING)
    finally:
        service.close()
    status, out, err = run(capsys, tmp_path, "--namespace", "kitchen")
    assert status == 0, err
    stored = len({same_task_key(g) for g in goals[:25]})  # near-duplicates merge into one memory when stored
    assert f"{stored} distinct tasks from namespace 'kitchen'" in out
    assert set(yaml.safe_load(out)["similarity"]) == {"delta", "sim_mean", "sim_std", "merge_threshold"}

    status, _, err = run(capsys, tmp_path, "--namespace", "attic")
    assert status == 2
    assert f"namespace 'attic': 0 distinct task texts; calibration needs at least {MIN_TASKS}" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", rf"0 distinct task texts; calibration needs at least {MIN_TASKS}"),
        (b"open the drawer\n" * 50, rf"1 distinct task texts; calibration needs at least {MIN_TASKS}"),
        (b'{"task": "open the drawer"}\n{"task": \n', r"line 2: not JSON"),
        (b'{"task": "open the drawer"}\n{"experience": "x"}\n', r"line 2: task: expected a non-empty string"),
        (b'{"task": "open the drawer"}\n["open the door"]\n', r"line 2: task: expected a non-empty string"),
        (b"open the drawer\n\xff\xfe close it\n", r"not UTF-8 text"),
        (b"open the drawer\n" + b"x" * 4001 + b"\n", r"line 2: task has 4001 characters; at most 4000"),
        (
            b"".join(f"{'OPEN' if i % 2 else 'open'} the  drawer{'.' * (i // 2)}\n".encode() for i in range(24)),
            r"every text is the same task up to case, spacing and punctuation",
        ),
    ],
)
def test_bad_task_files_are_refused_with_the_line_and_the_limit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    tasks = tmp_path / "tasks.txt"
    tasks.write_bytes(content)
    status, out, err = run(capsys, tmp_path, "--tasks", str(tasks))
    assert (status, out) == (2, "")
    assert err.startswith(f"memrl-mcp calibrate: {tasks}")
    assert re.search(message, err), err


def test_a_missing_file_a_missing_store_and_two_sources_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = run(capsys, tmp_path, "--tasks", str(tmp_path / "nope.txt"))
    assert status == 2 and "nope.txt: No such file or directory" in err
    status, _, err = run(capsys, tmp_path, "--namespace", "kitchen")
    assert status == 2 and f"no memory store in {tmp_path / 'data'}" in err
    with pytest.raises(SystemExit) as exit_info:
        run(capsys, tmp_path, "--tasks", "a.txt", "--namespace", "kitchen")
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_server_refuses_to_start_with_an_uncalibrated_model_and_calibrate_measures_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A FastEmbed model without measured constants; offline, a stand-in local folder under its expected file name.
    folder = tmp_path / "bge"
    shutil.copytree(MINILM_FOLDER, folder)
    (folder / "model.onnx").rename(folder / "model_optimized.onnx")
    monkeypatch.setenv("MEMRL_EMBEDDER", "fastembed")
    monkeypatch.setenv("MEMRL_EMBEDDING_MODEL", "BAAI/bge-small-en-v1.5")
    monkeypatch.setenv("MEMRL_EMBEDDING_MODEL_PATH", str(folder))
    assert cli.main(["--data-dir", str(tmp_path / "data")]) == 2
    assert "fastembed:BAAI/bge-small-en-v1.5: no measured similarity constants" in capsys.readouterr().err

    tasks = tmp_path / "tasks.txt"
    tasks.write_text("\n".join(database_questions(30)))
    config = tmp_path / "calibrated.yaml"
    status, _, err = run(capsys, tmp_path, "--tasks", str(tasks), "--out", str(config))
    assert status == 0, err
    assert "embedder fastembed:BAAI/bge-small-en-v1.5, 30 distinct tasks" in config.read_text()
    settings = load_settings(config, data_dir=tmp_path / "data")
    service = MemoryService.open(settings)  # with its measured constants, the model is accepted
    try:
        assert service.scale.delta == settings.similarity.delta
    finally:
        service.close()
