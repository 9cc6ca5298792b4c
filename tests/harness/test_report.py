"""Report from real run folders: the table's numbers, labels, per-type rows, and readable PNG curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from memrl_harness.report import build_report
from memrl_harness.results import Q_VALUES_FILE, EpisodeRecord, Mode, RunConfig, RunDir, TransferConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_run(
    root: Path,
    name: str,
    mode: Mode,
    outcomes: dict[int, list[bool]],
    *,
    benchmark: str = "toy",
    epochs: int | None = None,
    q_values: dict[str, float] | None = None,
    typed: bool = False,
    seed: int = 0,
    similarity: float | None = None,
) -> Path:
    run = RunDir(root / name)
    run.write_config(RunConfig(benchmark=benchmark, mode=mode, epochs=epochs or len(outcomes), model="m-1", seed=seed))
    if similarity is not None:
        run.similarity_file.write_text(json.dumps({"embedder": "e-1", "tasks": 3, "mean_pairwise": similarity}))
    for epoch, wins in outcomes.items():
        for i, won in enumerate(wins):
            run.append(
                EpisodeRecord(
                    epoch=epoch,
                    position=i,
                    task_id=f"t{i}",
                    success=won,
                    checker_reward=1.0 if won else -1.0,
                    steps=4,
                    prompt_tokens=100,
                    completion_tokens=20,
                    wall_s=0.5,
                    memory_ids=[f"m{i}"] if mode == "memrl" else [],
                    task_type=("pick" if i < 2 else "clean") if typed else None,
                    # memrl recalls every task and leaves the third's recall unreported: no Q update there.
                    recall_by="agent" if mode == "memrl" else None,
                    report_by="agent" if mode == "memrl" and i != 2 else None,
                    q_updates=1 if mode == "memrl" and i != 2 else 0,
                )
            )
    if q_values is not None:
        (run.path / Q_VALUES_FILE).write_text(json.dumps(q_values))
    return run.path


def table_row(report: str, first_cell: str) -> list[str]:
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{report}")


def table(report: str, first_header: str) -> dict[str, dict[str, str]]:
    """The markdown table whose header starts with ``first_header``: rows by first cell, cells by header."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000  # axes, lines, legend: not an empty canvas
    with Image.open(path) as image:
        assert image.size[0] >= 600 and image.size[1] >= 400
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert colours is not None and len(colours) > 50


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    # 3 tasks x 3 epochs. none: flat 1/3. memrl: the hand-computed run of test_metrics.
    none = make_run(tmp_path, "toy-none", "none", {e: [True, False, False] for e in (1, 2, 3)})
    memrl = make_run(
        tmp_path,
        "toy-memrl",
        "memrl",
        {1: [True, False, False], 2: [False, True, False], 3: [True, True, True]},
        q_values={"m0": 1.0, "m1": 2.0, "m2": 3.0},
        typed=True,
    )
    return [none, memrl]


def test_report_table_numbers(runs: list[Path], tmp_path: Path) -> None:
    path = build_report(runs, tmp_path / "out")
    assert path == tmp_path / "out" / "report.md"
    report = path.read_text()
    header = table_row(report, "run")
    memrl = dict(zip(header, table_row(report, "memrl"), strict=True))
    assert memrl["benchmark"] == "toy" and memrl["mode"] == "memrl" and memrl["model"] == "m-1"
    assert memrl["epochs"] == "3/3" and memrl["tasks"] == "3"
    assert memrl["last-epoch success"] == "1.000"
    assert memrl["best epoch"] == "3 (1.000)"
    assert memrl["final CSR"] == "1.000"
    assert memrl["forgetting"] == "0.167"
    # m0 on t0 (won 2 of 3 epochs), m1 on t1 (2/3), m2 on t2 (1/3); Q 1, 2, 3:
    # dx = (-1, 0, 1), dy = (1, 1, -2) / 9 -> r = (-3/9) / sqrt(2 * 6/81) = -3 / sqrt(12) = -0.866.
    assert memrl["Q-critic r"] == "-0.866 (n=3)"
    assert memrl["recalls reported"] == "6/9" and memrl["Q updates"] == "6"
    assert memrl["mean steps"] == "4.00"
    assert memrl["tokens (prompt + completion)"] == "1080 (900 + 180)"
    assert memrl["wall s (sum)"] == "4.5"
    none = dict(zip(header, table_row(report, "none"), strict=True))
    assert none["last-epoch success"] == "0.333" and none["final CSR"] == "0.333"
    assert none["forgetting"] == "0.000" and none["Q-critic r"] == "n/a"
    assert none["recalls reported"] == "n/a" and none["Q updates"] == "0"
    # Per-epoch and per-type tables, and each run got its summary files.
    assert "| memrl | 2 | 3/3 | 0.333 | 0.667 | 0.333 |" in report
    assert "| memrl | pick | 0.500 (1/2) | 0.500 (1/2) | 1.000 (2/2) |" in report
    assert "| memrl | clean | 0.000 (0/1) | 0.000 (0/1) | 1.000 (1/1) |" in report
    assert all((run / "summary.json").exists() and (run / "summary.csv").exists() for run in runs)
    for name in ("success_rate_toy.png", "csr_toy.png"):
        assert f"]({name})" in report
        assert_png(tmp_path / "out" / name)


def test_one_plot_pair_per_benchmark_and_partial_runs(runs: list[Path], tmp_path: Path) -> None:
    other = make_run(tmp_path, "web-rag", "rag", {1: [True, True], 2: [True]}, benchmark="web/shop", epochs=3)
    path = build_report([*runs, other], tmp_path / "out")
    report = path.read_text()
    rag = table_row(report, "rag / web/shop")  # benchmarks differ: labels name them
    assert rag[4] == "1/3 + partial (1/2)"
    assert rag[6] == "1.000"  # last whole epoch is 1
    assert "| rag / web/shop | 2 (partial) | 1/2 |" in report
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert pngs == ["csr_toy.png", "csr_web_shop.png", "success_rate_toy.png", "success_rate_web_shop.png"]
    for png in pngs:
        assert_png(tmp_path / "out" / png)


def test_same_label_runs_are_told_apart_by_folder(tmp_path: Path) -> None:
    a = make_run(tmp_path, "seed0", "none", {1: [True, False]})
    b = make_run(tmp_path, "seed1", "none", {1: [False, False]})
    report = build_report([a, b], tmp_path / "out", write_summaries=False).read_text()
    assert table_row(report, "none (seed0)")[6] == "0.500"
    assert table_row(report, "none (seed1)")[6] == "0.000"
    assert not (a / "summary.json").exists()
    assert "Per task type" not in report


def test_seeds_of_one_setting_are_aggregated_with_their_count(tmp_path: Path) -> None:
    """Runs differing only in the seed: mean +- std per epoch and of the headline figures, n named; MemRL's gain
    sits next to the tasks' similarity; the plot draws the mean with a band."""
    runs = [
        make_run(tmp_path, "m0", "memrl", {1: [True, False, False], 2: [True, True, False]}, seed=0, similarity=0.4),
        make_run(tmp_path, "m1", "memrl", {1: [False, False, False], 2: [True, True, True]}, seed=1, similarity=0.4),
        make_run(tmp_path, "n0", "none", {1: [True, False, False], 2: [False, True, False]}, seed=0, similarity=0.4),
    ]
    out = tmp_path / "out"
    report = build_report(runs, out).read_text()
    settings = table(report, "setting")
    memrl = settings["memrl"]
    assert memrl["seeds"] == "0, 1"
    assert memrl["last-epoch success"] == "0.833 ± 0.236 (n=2)"  # 2/3 and 3/3
    assert memrl["CSR at last epoch"] == "0.833 ± 0.236 (n=2)"
    assert memrl["held-out success (transfer)"] == "n/a"
    assert settings["none"]["last-epoch success"] == "0.333 (n=1)"
    assert "| memrl | 1 | 0.167 ± 0.236 (n=2) | 0.167 ± 0.236 (n=2) |" in report
    similarity = table(report, "benchmark")["toy"]
    assert similarity["mean pairwise similarity"] == "0.400" and similarity["embedder"] == "e-1"
    assert similarity["gain over"] == "none +0.500"
    assert_png(out / "success_rate_toy.png")
    # The band: pixels of the fill colour (the line's colour, lightened) exist only where two seeds are drawn.
    banded = build_report(runs[:2], tmp_path / "banded", write_summaries=False)
    single = build_report(runs[:1], tmp_path / "single", write_summaries=False)
    colours = [
        len(Image.open(r.parent / "success_rate_toy.png").convert("RGB").getcolors(1_000_000) or [])
        for r in (banded, single)
    ]
    assert colours[0] > colours[1]


def test_transfer_runs_report_their_held_out_success(tmp_path: Path) -> None:
    path = make_run(tmp_path, "t0", "memp", {1: [True, False, False]})
    run = RunDir(path)
    config = run.read_config().model_copy(update={"transfer": TransferConfig(held_out=0.5)})
    run.write_config(config)
    held = run.transfer
    held.path.mkdir()
    for i, won in enumerate([True, True, False, True]):
        held.append(
            EpisodeRecord(epoch=1, position=i, task_id=f"h{i}", success=won, checker_reward=1.0, steps=1, wall_s=0.1)
        )
    report = build_report([path], tmp_path / "out").read_text()
    row = table(report, "run")["memp, transfer"]
    assert row["held-out success"] == "0.750" and row["last-epoch success"] == "0.333"
    assert table(report, "setting")["memp, transfer"]["held-out success (transfer)"] == "0.750 (n=1)"
    assert (held.path / "summary.json").exists()
