"""LLB OS: the bubblewrap sandbox (oracle, isolation, background jobs, timeouts, teardown) and a Runner run.

These tests need root, bubblewrap, cgroup v1 and the root filesystem (``make sandbox``, a prerequisite of
``make test``): without them they fail, they do not skip. The attacks of issue 12 are in test_attacks_llb_os.py.
"""

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

from memrl_harness.backends.bwrap import BwrapSandbox as Sandbox
from memrl_harness.backends.sandbox import SandboxError
from memrl_harness.benchmarks import load_benchmark
from memrl_harness.benchmarks.llb_os import LLBOSBenchmark
from memrl_harness.llm import LLM
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.harness.processes import alive_processes

# needs the bubblewrap sandbox and its root filesystem: `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench() -> LLBOSBenchmark:
    return LLBOSBenchmark()


def _mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def test_tasks_and_registry(bench: LLBOSBenchmark) -> None:
    tasks = bench.tasks()
    assert len(tasks) == 350 and len({t.id for t in tasks}) == 350
    task = tasks[0]
    assert task.intent == task.data["instruction"].strip() and task.type == task.data["skill_list"][0]
    assert bench.script(task, "evaluation") and bench.script(task, "ground_truth")
    assert [t.id for t in load_benchmark("llb-os", ids="4,1").tasks()] == ["4", "1"]


def test_missing_rootfs_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="make sandbox"):
        Sandbox(tmp_path / "nothing")
    with pytest.raises(SandboxError):
        LLBOSBenchmark(rootfs=str(tmp_path))


def test_ground_truth_passes_the_evaluation_and_nothing_does_not(bench: LLBOSBenchmark) -> None:
    # All 350 measured by hand (see llb_os's doc): ground truth 350/350, evaluation before it 0/350.
    sample = random.Random(0).sample(list(bench.tasks()), 120)

    def oracle(task):
        with bench.sandbox() as box:
            bench.initialize(box, task)
            before = bench.evaluate(box, task)
            truth = box.run(bench.script(task, "ground_truth"), timeout=bench.options.eval_timeout)
            after = bench.evaluate(box, task)
        return task.id, before.exit_code == 0, after.exit_code == 0 and not after.timed_out, truth.output[-300:]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(oracle, sample))
    passed = [r for r in results if r[2]]
    assert len(passed) >= 0.98 * len(results), [r for r in results if not r[2]]
    assert not any(r[1] for r in results), [r[0] for r in results if r[1]]


def test_state_and_background_jobs_persist_between_commands() -> None:
    with Sandbox() as box:
        assert box.run("echo hi > /tmp/a; useradd -m alice").exit_code == 0
        assert box.run("cat /tmp/a; id -u alice").output.split()[0] == "hi"
        started = time.monotonic()
        assert box.run("nohup sleep 300 >/dev/null 2>&1 & echo $! > /tmp/pid; sleep 60 &").exit_code == 0
        assert time.monotonic() - started < 5  # a background job holding the output does not block
        assert box.run('kill -0 "$(cat /tmp/pid)" && pgrep -c sleep').output.strip() == "2"
        assert box.run("exit 3").exit_code == 3
        assert box.run("echo out; echo err >&2").output.split() == ["out", "err"]


def test_a_command_timeout_is_enforced_and_the_sandbox_goes_on() -> None:
    with Sandbox(command_timeout=2) as box:
        started = time.monotonic()
        result = box.run("echo before; sleep 60; echo after")
        assert result.timed_out and result.output.strip() == "before"
        assert time.monotonic() - started < 6
        assert box.run("pgrep -x sleep || echo none").output.strip() == "none"  # its group was killed
        assert box.run("yes | head -c 200000").output.startswith("y\ny\n")
        assert len(box.run("head -c 1000000 /dev/zero | tr '\\0' x").output) == 65536


def test_commands_cannot_write_to_the_host() -> None:
    name = f"llb-escape-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="llb-host-") as host_dir:
        target = Path(host_dir)
        with Sandbox() as box:
            for script in (
                f"touch /root/{name}",
                f"touch /{name}",
                f"mkdir -p {target} && touch {target}/{name}",
                f"nsenter -a -t 1 -w{target} touch {name}",
                f"nsenter -m -t 1 -w{target} touch {name}; nsenter -w{target} touch {name}",
                f"mount -t tmpfs none /mnt && touch /mnt/{name}",
                f"mknod /tmp/disk b 8 0 && echo made {name}",
                "umount / && touch /x",
                "unshare -m true && chroot /proc/1/root touch /" + name,
            ):
                box.run(script)
            assert box.run("mount -t tmpfs none /mnt").exit_code != 0  # seccomp: no mount
            assert box.run("mknod /tmp/disk b 8 0").exit_code != 0  # no device nodes in a user namespace
            assert box.run(f"ls {target}").output.strip() == name  # the sandbox's own copy
        assert list(target.iterdir()) == []
    assert not Path(f"/root/{name}").exists() and not Path(f"/{name}").exists()


def test_commands_cannot_reach_the_network() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # a listener on the host's loopback
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with Sandbox() as box:
            result = box.run(f"curl -sS -m 3 http://127.0.0.1:{port}/ ; echo rc=$?")
            assert "rc=0" not in result.output and "rc=" in result.output
            assert box.run("curl -sS -m 3 http://example.com/ >/dev/null 2>&1; echo $?").output.strip() != "0"
        # The listener is real: the host reaches it.
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            pass


def test_teardown_leaves_no_process_mount_or_file() -> None:
    marker = f"llb-marker-{uuid.uuid4().hex}"
    box = Sandbox()
    folder, groups = box.dir, list(box.cgroups.dirs.values())
    assert groups and all((group / "cgroup.procs").read_text().split() for group in groups)
    try:
        sleeper = f"python3 -c 'import time; time.sleep(300)' {marker}"
        box.run(f"setsid nohup {sleeper} >/dev/null 2>&1 & ({sleeper} &) ; echo x > /tmp/y")
        deadline = time.monotonic() + 5
        while len(alive_processes(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(alive_processes(marker)) == 2
        assert str(folder) not in _mounts()  # the overlay lives in the sandbox's own mount namespace
    finally:
        box.close()
    box.close()
    deadline = time.monotonic() + 5
    while alive_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_processes(marker) == []
    assert box.process.poll() is not None
    assert not folder.exists() and str(folder) not in _mounts()
    assert not any(group.exists() for group in groups)  # its cgroups are gone too
    with pytest.raises(SandboxError):
        box.run("true")


TASKS = ("0", "1")


@pytest.mark.anyio
async def test_a_memrl_run_with_the_ground_truth(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path) -> None:
    bench = LLBOSBenchmark(ids=",".join(TASKS), max_rounds=3)
    tasks = {t.id: t for t in bench.tasks()}

    def answer(request: RecordedRequest) -> str:
        first = next(m["content"] for m in request.messages if m["role"] == "user")
        task = next((t for t in tasks.values() if f"Task: {t.intent}\n\nYou have at most" in first), None)
        if task is None:  # the runner's own prompts (experience / reflection)
            return "1. inspect the system 2. run the command 3. verify"
        played = sum(m["role"] == "assistant" for m in request.messages)
        # Task "0" is solved with its ground truth; task "1" only looks around and finishes.
        if played == 0:
            script = bench.script(task, "ground_truth") if task.id == "0" else "ls /"
            return json.dumps({"thought": "do it", "action": "bash", "content": script})
        return json.dumps({"thought": "done", "action": "finish", "content": ""})

    fake_llm.responder = answer
    config = RunConfig(benchmark="llb-os", mode="memrl", epochs=2, seed=0)
    with anyio.fail_after(120):
        records = await Runner(config, bench, RunDir(tmp_path / "run"), llm).run()
    assert sorted((r.epoch, r.task_id, r.success, r.checker_reward) for r in records) == sorted(
        (e, i, i == "0", 1.0 if i == "0" else 0.0) for e in (1, 2) for i in TASKS
    )
    episodes = [r for r in fake_llm.chat_requests if "JSON object only" in r.messages[1]["content"]]
    assert episodes and all(r.response_format for r in episodes)
    shown = [m["content"] for r in episodes for m in r.messages if m["role"] == "user"]
    assert any(s.startswith("The output of the command (exit code") for s in shown)
