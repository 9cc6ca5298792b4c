"""`memrl-harness` as a user runs it: the controlled benchmark in every mode, a report, a kill -9 and a resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.results import Q_VALUES_FILE, RunDir
from tests.harness.fake_llm import FakeLLMServer
from tests.harness.hle_rows import ROWS

# runs the harness end to end, with memrl-mcp servers: `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow

HARNESS = [sys.executable, "-m", "memrl_harness.cli"]
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--tasks", "16", "--epochs", "3", "--option", "families=2"]


def harness(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
    return subprocess.run(
        [*HARNESS, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


def test_three_modes_and_a_report(tmp_path: Path) -> None:
    for mode in ("none", "rag", "memrl"):
        done = harness("run", "controlled", "--mode", mode, "--runs", str(tmp_path / "runs"), *SMALL, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        headline = json.loads(done.stdout)
        run = RunDir(Path(headline["run_dir"]))
        assert len(run.episodes()) == 16 * 3
        assert run.summary_csv.exists() and json.loads(run.summary_json.read_text())["tasks"] == 16
        assert (run.path / Q_VALUES_FILE).exists() == (mode == "memrl")
        assert (run.memory_dir.exists()) == (mode != "none")
        # Quiet by default: the memory server's log lines go to the run folder, not to the terminal.
        assert "tool call" not in done.stderr
        assert (mode == "none") or "tool call" in run.server_log.read_text()
        # run.json records the constants the memory server really used: controlled runs at ALFWorld's
        # (docs/algorithm.md).
        settings = run.read_config().memory_settings or {}
        assert [settings.get(key) for key in ("k1", "k2", "alpha")] == ([None] * 3 if mode == "none" else [5, 3, 0.3])

    runs = sorted((tmp_path / "runs").iterdir())
    report = harness("report", *map(str, runs), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert all(f"| {mode} " in text for mode in ("none", "rag", "memrl"))
    pngs = list((tmp_path / "report").glob("*.png"))
    assert len(pngs) == 2 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_a_killed_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["run", "controlled", "--mode", "memrl", "--run-dir", str(run_dir), *SMALL]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
    first = subprocess.Popen(
        [*HARNESS, *args], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    episodes = run_dir / "episodes.jsonl"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not episodes.exists() or len(episodes.read_text().splitlines()) < 20):
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the harness and its memrl-mcp child, mid-stream
        first.wait(timeout=30)
    before = RunDir(run_dir).episodes()
    assert 20 <= len(before) < 48

    resumed = harness(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    records = RunDir(run_dir).episodes()
    pairs = [(r.epoch, r.task_id) for r in records]
    assert len(pairs) == len(set(pairs)) == 48  # every episode exactly once
    assert records[: len(before)] == before  # what was done stays; only the rest ran
    # Every recorded episode has its trajectory, past the kill (a torn one was cut, a re-run one kept last).
    kept = {(t.epoch, t.task_id): t for t in RunDir(run_dir).trajectories()}
    assert {pair: (t.stored_id, t.checker_reward) for pair, t in kept.items()} == {
        (r.epoch, r.task_id): (r.stored_id, r.checker_reward) for r in records
    }


def test_hle_from_a_user_file_with_an_llm_from_the_environment(tmp_path: Path) -> None:
    data = tmp_path / "hle.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    with FakeLLMServer() as fake:
        fake.responder = lambda request: "Explanation: known.\nAnswer: 101\nConfidence: 90%"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
        env |= {"MEMRL_LLM_BASE_URL": fake.base_url, "MEMRL_LLM_MODEL": fake.model}
        done = subprocess.run(
            [*HARNESS, "run", "hle", "--data", str(data), "--mode", "none", "--epochs", "1", "--runs", "runs"],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = {r.task_id: r.success for r in RunDir(tmp_path / json.loads(done.stdout)["run_dir"]).episodes()}
    assert records == {row["id"]: row["answer"] == "101" for row in ROWS}  # exact match, no judge set


def test_the_llm_can_sit_in_the_run_file_beside_the_memory_settings(tmp_path: Path) -> None:
    """One file for a run: memrl-mcp's groups and the harness's llm: group (endpoint and model); memrl-mcp gets the
    memory's part only, and the run records the constants it used."""
    data = tmp_path / "hle.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    run_file = tmp_path / "run.yaml"
    with FakeLLMServer() as fake:
        fake.responder = lambda request: "Explanation: known.\nAnswer: 101\nConfidence: 90%"
        run_file.write_text(f"llm:\n  base_url: {fake.base_url}\n  model: {fake.model}\nretrieval:\n  k1: 4\n  k2: 2\n")
        args = ["run", "hle", "--data", str(data), "--mode", "memrl", "--epochs", "1", "--config", str(run_file)]
        done = harness(*args, "--runs", "runs", cwd=tmp_path)  # no MEMRL_LLM_* in its environment
        assert done.returncode == 0, done.stderr
        assert fake.requests and {request.model for request in fake.requests} == {fake.model}
    run = RunDir(tmp_path / json.loads(done.stdout)["run_dir"])
    config = run.read_config()
    assert (config.model, config.memory_config) == (fake.model, str(run_file))
    assert ((config.memory_settings or {})["k1"], (config.memory_settings or {})["k2"]) == (4, 2)
    assert "llm" not in run.memory_settings.read_text() and "k1: 4" in run.memory_settings.read_text()


def test_a_key_in_the_run_file_and_a_bad_llm_entry_are_refused(tmp_path: Path) -> None:
    run_file = tmp_path / "run.yaml"
    for content, named in (
        ("llm:\n  model: m\n  api_key: sk-do-not-keep-me\n", "llm.api_key: a key does not belong in a settings file"),
        ("llm:\n  modle: m\n", "llm.modle: no such field"),
        ("llm:\n  model: 5\n", "llm.model: Input should be a valid string"),
        ("lmm:\n  model: m\n", "lmm: no such group; did you mean llm?"),
        ("retrieval:\n  k9: 3\n", f"config file {run_file}: retrieval.k9: no such setting in retrieval"),
    ):
        run_file.write_text(content)
        refused = harness("run", "controlled", "--mode", "memrl", "--config", str(run_file), cwd=tmp_path)
        assert refused.returncode == 2 and named in refused.stderr, (content, refused.stderr)
        assert "sk-do-not-keep-me" not in refused.stderr and "Traceback" not in refused.stderr
        if "api_key" in content:
            assert "set MEMRL_LLM_API_KEY in the environment instead" in refused.stderr


def test_the_help_names_the_llm_settings_and_the_data(tmp_path: Path) -> None:
    shown = harness("run", "--help", cwd=tmp_path).stdout
    for name in ("MEMRL_LLM_BASE_URL", "MEMRL_LLM_MODEL", "MEMRL_LLM_API_KEY", "llm: {base_url", "MEMRL_SHARED_DATA"):
        assert name in shown
    guide = harness("data", cwd=tmp_path)
    assert guide.returncode == 0 and "# Benchmark data: what to download and where to put it" in guide.stdout
    assert guide.stdout.endswith((ROOT / "docs" / "benchmark-data.md").read_text() + "\n")


def test_a_bad_option_and_a_missing_llm_are_named(tmp_path: Path) -> None:
    bad = harness("run", "controlled", "--option", "families=99", cwd=tmp_path)
    assert bad.returncode == 2 and "families" in bad.stderr and "Traceback" not in bad.stderr
    no_llm = harness("run", "controlled", "--option", "agent=llm", cwd=tmp_path)
    assert no_llm.returncode == 2 and "MEMRL_LLM_BASE_URL" in no_llm.stderr
    for args, named in (
        (["--mode", "memrl", "--trials", "2"], "--trials: only --mode reflexion"),
        (["--seed", "0", "1", "--run-dir", "one"], "--run-dir names one run's folder"),
        (["--held-out", "1.5"], "held_out"),
        (["--eval-option", "families=99"], "families"),
    ):
        refused = harness("run", "controlled", *args, cwd=tmp_path)
        assert refused.returncode == 2 and named in refused.stderr and "Traceback" not in refused.stderr, args
    assert not (tmp_path / "runs").exists()


def test_options_are_read_by_the_benchmarks_model(tmp_path: Path) -> None:
    """``--option`` text is read by the benchmark's options model: a bad value or an unknown name is refused before
    anything runs, naming the benchmark, the option and the limit (every one refused, at once); text that reads as the
    option's type is taken as that value; ``memrl-harness options`` lists them with their defaults."""
    for args, named in (
        (["controlled", "--option", "families=1"], "controlled: families: must be at least 2 and at most 16, got '1'"),
        (["controlled", "--option", "famlies=4"], "controlled: famlies: unknown option (did you mean families?)"),
        (["controlled", "--option", "decoy_luck=often"], "controlled: decoy_luck: must be a valid number, got 'often'"),
        (
            ["controlled", "--held-out", "0.5", "--eval-option", "twins=maybe"],
            "controlled: twins: must be true or false, got 'maybe'",
        ),
        (
            ["controlled-steps", "--option", "causes=4", "--option", "fixes=4"],
            "controlled-steps: fixes: must be at least causes + 1 = 5, got 4",
        ),
        # The two LLB benchmarks share their common options, under one name each, and the rules that go with them.
        (["llb-os", "--option", "output_chars=90"], "llb-os: output_chars: unknown option (did you mean max_output_"),
        (["llb-os", "--option", "image=memrl/llb-os:x"], "llb-os: image: only with backend=docker"),
        (["llb-db", "--option", "image=memrl/mariadb:x"], "llb-db: image: only with backend=docker"),
        (["hle", "--option", "limit=0"], "hle: data: required: the questions, a jsonl or parquet file (HLE is not "
         "shipped: --option data=PATH); limit: must be at least 1, got '0'"),
    ):  # fmt: skip
        refused = harness("run", *args, "--runs", str(tmp_path / "runs"), cwd=tmp_path)
        assert refused.returncode == 2 and named in refused.stderr and "Traceback" not in refused.stderr, args
        assert f"memrl-harness options {args[0]} lists its options" in refused.stderr
    assert not (tmp_path / "runs").exists()

    text = ["--option", "families=2", "--option", "tasks_per_family= 3", "--option", "twins=false"]
    text += ["--option", "paraphrase=yes", "--option", "slip=0.0", "--option", "seed="]  # empty: the default
    done = harness("run", "controlled", "--mode", "none", "--epochs", "1", "--runs", str(tmp_path / "runs"), *text,
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    ran = {(t.task_id, t.intent) for t in RunDir(Path(json.loads(done.stdout)["run_dir"])).trajectories()}
    typed = ControlledBenchmark(families=2, tasks_per_family=3, twins=False, paraphrase=True, slip=0.0)
    assert ran == {(t.id, t.intent) for t in typed.tasks()} and len(ran) == 6

    listed = harness("options", "controlled", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert list(lines) == [f"{name}={value}" for name, value in (
        ("families", 8), ("tasks_per_family", 8), ("procedures", 12), ("decoys", 2), ("decoy_luck", 0.4),
        ("slip", 0.0), ("twins", "true"), ("seed", 0), ("agent", "script"), ("paraphrase", "false"),
    )]  # fmt: skip
    assert "at least 2 and at most 16" in lines["families=8"] and "script | llm" in lines["agent=script"]


def test_several_modes_and_seeds_in_one_command_and_a_transfer(tmp_path: Path) -> None:
    """One command runs every mode for every seed; the report aggregates the seeds of each mode."""
    runs = tmp_path / "runs"
    args = ["--tasks", "8", "--epochs", "2", "--option", "families=2", "--runs", str(runs)]
    done = harness("run", "controlled", "--mode", "memp", "reflexion", "--seed", "0", "1", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    headlines = json.loads(done.stdout)
    assert [Path(h["run_dir"]).name for h in headlines] == [
        f"controlled-{mode}-seed{seed}" for mode in ("memp", "reflexion") for seed in (0, 1)
    ]
    for headline in headlines:
        run = RunDir(Path(headline["run_dir"]))
        config = run.read_config()
        assert len(run.episodes()) == 16 and len(run.trajectories()) == 16
        assert run.memory_export.exists() == (config.mode == "memp") and run.similarity_file.exists()
        assert config.attempts == (3 if config.mode == "reflexion" else 1)
    report = harness("report", *(h["run_dir"] for h in headlines), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| memp | 0, 1 |" in text and "| reflexion (3 trials) | 0, 1 |" in text and "(n=2)" in text

    transfer = harness(
        "run", "controlled", "--mode", "memrl", "--held-out", "0.5", "--eval-option", "paraphrase=true", *args,
        cwd=tmp_path,
    )  # fmt: skip
    assert transfer.returncode == 0, transfer.stderr
    headline = json.loads(transfer.stdout)
    run = RunDir(Path(headline["run_dir"]))
    assert run.path.name == "controlled-memrl-transfer-seed0"
    held = run.transfer.episodes()
    assert held and len(held) + len(run.episodes()) // 2 == 8  # half of the first 8 tasks, by id hash
    assert headline["transfer_success"] == sum(r.success for r in held) / len(held)
    assert (run.transfer.path / "summary.json").exists()


def test_a_run_resumed_under_other_memory_settings_is_refused(tmp_path: Path) -> None:
    """Same arguments, but the settings file behind --config was edited: the constants differ, so it is not the
    same run (an upgrade that changes a default is caught the same way)."""
    settings = tmp_path / "memory.yaml"
    settings.write_text("learning:\n  alpha: 0.3\n")
    args = ["run", "controlled", "--mode", "memrl", "--run-dir", str(tmp_path / "run"), "--tasks", "4"]
    args += ["--epochs", "1", "--config", str(settings)]
    assert harness(*args, cwd=tmp_path).returncode == 0
    settings.write_text("learning:\n  alpha: 0.9\n")
    again = harness(*args, cwd=tmp_path)
    assert again.returncode == 2 and "settings changed since this run began (alpha)" in again.stderr
