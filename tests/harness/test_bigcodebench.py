"""BigCodeBench: the checker (oracle, stubs, isolation, limits) and a run through the Runner.

The checks run in the bubblewrap jail (root, bubblewrap and cgroup v1 needed: they fail without them). The
attacks of issue 12 are in test_attacks_bigcodebench.py."""

from __future__ import annotations

import json
import random
import socket
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest

from memrl_harness.backends.sandbox import SandboxError
from memrl_harness.benchmarks import load_benchmark
from memrl_harness.benchmarks.bigcodebench import BigCodeBenchmark, check, extract_code
from memrl_harness.llm import LLM
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.harness.processes import alive_processes, venv_under
from tests.support.benchmark_data import benchmark_data

pytestmark = pytest.mark.slow  # needs the bubblewrap sandbox: `make test` runs it, `make test-fast` does not

# Canonical solutions whose tests take 10-60 s by design (sleeps, subprocess timeouts): left out
# of the sampled oracle test to keep it fast; all 327 were measured by hand (module doc).
SLOW = {"BigCodeBench/0", "BigCodeBench/195", "BigCodeBench/220", "BigCodeBench/1040", "BigCodeBench/1103"}
SLOW |= {"BigCodeBench/1104", "BigCodeBench/1105"}
PASSING_TEST = "import unittest\nclass TestCases(unittest.TestCase):\n    def test_ok(self):\n        task_func()\n"


@pytest.fixture(scope="module")
def bench() -> BigCodeBenchmark:
    return BigCodeBenchmark(timeout=30)


def _sample(bench: BigCodeBenchmark, n: int, seed: int):
    tasks = [t for t in bench.tasks() if t.id not in SLOW]
    return random.Random(seed).sample(tasks, n)


def test_default_tasks_are_the_stdlib_only_ids(bench: BigCodeBenchmark) -> None:
    ids = json.loads(benchmark_data("bigcodebench", "stdlib_only_ids.json").read_text())
    assert [t.id for t in bench.tasks()] == ids
    task = bench.tasks()[0]
    assert len(task.intent) <= 304 and task.data["instruct_prompt"].startswith(task.intent[:200])
    split = BigCodeBenchmark(split="full_seed123:val")
    assert len(split.tasks()) == 342
    assert [t.id for t in load_benchmark("bigcodebench", ids="BigCodeBench/1,BigCodeBench/2").tasks()] == [
        "BigCodeBench/1",
        "BigCodeBench/2",
    ]


def test_canonical_solutions_pass_and_stubs_do_not(bench: BigCodeBenchmark) -> None:
    oracle = _sample(bench, 60, seed=0)
    stubs = _sample(bench, 30, seed=1)
    jobs = [(t, t.data["code_prompt"] + t.data["canonical_solution"], "oracle") for t in oracle]
    jobs += [(t, t.data["code_prompt"] + "    pass\n", "stub") for t in stubs]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: (job[0].id, job[2], bench.check(job[0], job[1])), jobs))
    oracle_results = [r for _, kind, r in results if kind == "oracle"]
    passed = sum(r.passed for r in oracle_results)
    assert len(oracle_results) == 60
    assert passed >= 0.95 * len(oracle_results), [
        (i, r.status) for i, k, r in results if k == "oracle" and not r.passed
    ]
    # 272's tests mock everything: a stub passes them where requests_mock is installed.
    assert not any(r.passed for i, kind, r in results if kind == "stub" and i != "BigCodeBench/272")


def test_outcomes_syntax_error_fail_and_pass() -> None:
    assert check("def task_func(:\n    pass", PASSING_TEST).status == "syntax_error"
    assert check("def task_func():\n    raise ValueError('no')", PASSING_TEST).status == "fail"
    failing = check("def task_func():\n    return 1", PASSING_TEST + "        self.assertEqual(task_func(), 2)\n")
    assert failing.status == "fail" and "test_ok" in failing.details
    assert check("def task_func():\n    return 1", PASSING_TEST).status == "pass"
    assert check("import sys\nsys.exit(0)\ndef task_func(): pass", PASSING_TEST).status == "fail"


def test_the_solution_cannot_reach_the_network() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # a listener on the host's loopback
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = (
            "import socket\ndef task_func():\n"
            f"    with socket.create_connection(('127.0.0.1', {port}), timeout=3):\n        return 'reached'\n"
        )
        test = (
            "import unittest\nclass TestCases(unittest.TestCase):\n    def test_no_network(self):\n"
            "        with self.assertRaises(OSError):\n            task_func()\n"
        )
        result = check(code, test, timeout=20)
        assert result.status == "pass", result.details
        # The same code outside the checker does reach it: the listener is real.
        namespace: dict = {}
        exec(code, namespace)
        assert namespace["task_func"]() == "reached"


def _spawner(marker: str, hang: bool) -> str:
    """Code that leaves two sleeping children (one in its group, one escaped with setsid)."""
    return (
        "import subprocess, sys, time\n"
        "def task_func():\n"
        f"    cmd = [sys.executable, '-c', 'import time; time.sleep(300)', '{marker}']\n"
        "    subprocess.Popen(cmd)\n"
        "    subprocess.Popen(cmd, start_new_session=True)\n"
        "    time.sleep(0.5)\n" + ("    time.sleep(300)\n" if hang else "") + "    return 1\n"
    )


@pytest.mark.parametrize("hang", [False, True], ids=["returns", "times-out"])
def test_no_child_survives_the_check_and_a_timeout_is_reported(hang: bool) -> None:
    marker = f"bcb-marker-{uuid.uuid4().hex}"
    started = time.monotonic()
    result = check(_spawner(marker, hang), PASSING_TEST, timeout=4)
    elapsed = time.monotonic() - started
    assert result.status == ("timeout" if hang else "pass"), result.details
    assert elapsed < 10
    deadline = time.monotonic() + 3
    while alive_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive_processes(marker) == []


def test_memory_limit() -> None:
    code = "def task_func():\n    return bytearray(2 * 1024 ** 3)\n"
    result = check(code, PASSING_TEST, memory_mb=512)
    assert result.status == "fail" and "MemoryError" in result.details["test_ok"]


def test_the_working_directory_is_private_and_removed() -> None:
    marker = f"left-{uuid.uuid4().hex}.txt"
    code = f"import os\ndef task_func():\n    open('{marker}', 'w').write('x')\n    return os.getcwd()\n"
    test = PASSING_TEST + "        self.assertEqual(task_func(), '/home/sandbox')\n"
    before = set(Path(tempfile.gettempdir()).glob("memrl-bcb-*"))
    assert check(code, test).status == "pass"
    assert set(Path(tempfile.gettempdir()).glob("memrl-bcb-*")) == before  # its staging folder is removed
    for folder in (Path(tempfile.gettempdir()), Path.cwd(), Path.home(), Path("/")):
        assert not (folder / marker).exists()


@pytest.mark.parametrize("parent", ["/tmp", "/dev/shm"])
def test_an_environment_under_the_jails_own_folders_runs_the_checks(parent: str) -> None:
    # The jail mounts its own /tmp and /dev: an interpreter under them used to be hidden (bwrap: execvp ... No
    # such file or directory), which made every check fail from a clone in /tmp.
    with venv_under(parent) as venv:
        code = "import sys\ndef task_func():\n    return sys.prefix\n"
        result = check(
            code,
            PASSING_TEST + f"        self.assertEqual(task_func(), {str(venv)!r})\n",
            python=str(venv / "bin" / "python"),
        )
        assert result.status == "pass", result.details


@pytest.mark.parametrize("prefix", ["/tmp", "/home", "/dev", "/"])
def test_an_environment_that_would_cover_the_jails_own_folders_is_refused(tmp_path: Path, prefix: str) -> None:
    python = tmp_path / "python"  # an interpreter whose environment is at `prefix` (what it answers the probe)
    python.write_text(f"#!/bin/sh\necho '{json.dumps([prefix] * 4)}'\n")
    python.chmod(0o755)
    with pytest.raises(ValueError, match=rf"^python: {python} lives in {prefix}, which would show the host's /"):
        check("def task_func():\n    return 1\n", PASSING_TEST, python=str(python))


def test_extract_code() -> None:
    answer = "Here:\n```python\nimport os\n```\nand\n```python\ndef task_func(x):\n    return x\n```\nDone."
    assert extract_code(answer) == "def task_func(x):\n    return x\n"
    assert extract_code("```py\nprint(1)\n```") == "print(1)\n"
    assert extract_code("def task_func():\n    return 2") == "def task_func():\n    return 2\n"
    assert extract_code("```python\ndef task_func():\n    return 3\n") == "def task_func():\n    return 3\n"  # unclosed


SOLVED, GARBAGE = "BigCodeBench/2", "BigCodeBench/4"


@pytest.mark.anyio
async def test_a_memrl_run_rewards_the_unit_tests(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path) -> None:
    bench = BigCodeBenchmark(ids=f"{SOLVED},{GARBAGE}", timeout=30)
    tasks = {t.id: t for t in bench.tasks()}
    solved = tasks[SOLVED].data

    def answer(request: RecordedRequest) -> str:
        text = request.last_user
        if "```python code block" in text:
            if solved["instruct_prompt"].strip() in text:
                return f"Sure:\n```python\n{solved['code_prompt']}{solved['canonical_solution']}\n```"
            return "I am not sure, maybe use a loop."
        if text.rstrip().endswith("Steps:"):
            return "1. read the spec 2. write task_func 3. handle edge cases"
        return "The answer had no code; write the function in a python block."

    fake_llm.responder = answer
    config = RunConfig(benchmark="bigcodebench", mode="memrl", epochs=2, seed=0)
    with anyio.fail_after(150):
        records = await Runner(config, bench, RunDir(tmp_path / "run"), llm).run()
    assert sorted((r.epoch, r.task_id, r.success, r.checker_reward) for r in records) == sorted(
        (e, i, i == SOLVED, 1.0 if i == SOLVED else -1.0) for e in (1, 2) for i in (SOLVED, GARBAGE)
    )
    prompts = [r.last_user for r in fake_llm.chat_requests if "```python code block" in r.last_user]
    assert len(prompts) == 4
    second = [p for p in prompts[2:] if solved["instruct_prompt"].strip() in p]
    assert second and "Experiences that worked on similar tasks" in second[0]


def test_a_missing_jail_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to be found
    with pytest.raises(SandboxError, match=r"bwrap not found.*make sandbox"):
        BigCodeBenchmark()
