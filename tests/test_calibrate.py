"""``memrl-mcp calibrate`` through the CLI, on real task texts of the benchmarks with the real default embedder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from memrl_harness.install import shared_data_root
from memrl_mcp import cli
from memrl_mcp.embeddings import Embedder
from memrl_mcp.embeddings.calibrate import MIN_TASKS, same_task_key
from memrl_mcp.embeddings.minilm import MINILM_FOLDER
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience
from memrl_mcp.settings import load_settings

GOAL = re.compile(r"Your task is to: ([^\"\n]+)")


def alfworld_goals() -> list[str]:
    games = sorted(shared_data_root().glob("alfworld/valid_seen/*/*/game.tw-pddl"))
    assert games, f"no ALFWorld games under {shared_data_root()}/alfworld (see ../shared/data/README.md)"
    goals = (GOAL.search(json.loads(game.read_text())["grammar"]) for game in games)
    return list(dict.fromkeys(match.group(1).strip() for match in goals if match))


def llb_instructions(count: int) -> list[str]:
    rows = json.loads((shared_data_root() / "llb" / "db_train.json").read_text())
    return [row["instruction"].strip() for row in rows.values()][:count]


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli.main(["calibrate", "--data-dir", str(tmp_path / "data"), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_calibrate_a_task_file_writes_settings_that_follow_the_documented_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, embedder: Embedder
) -> None:
    goals = alfworld_goals()
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
    tasks = llb_instructions(40)
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
    goals = alfworld_goals()
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
    tasks.write_text("\n".join(llb_instructions(30)))
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
