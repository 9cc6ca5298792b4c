"""The local default LLM end to end: llama.cpp's real server, SmolLM2, the harness's client.

No skip when llama-cpp-python or the model is missing: ``make llm`` installs them for
``make test``, and a silently skipped test would hide a broken install.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.llm import LLM, LLMError, is_context_overflow
from memrl_harness.local_llm import LocalLLMError, LocalServer, check_installed, free_port, local_llm_server
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import Runner

pytestmark = pytest.mark.slow  # needs the compiled llama.cpp server: `make test` runs it, `make test-fast` does not

SCHEMA = {
    "title": "Move",
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["north", "south", "east", "west"]},
        "why": {"type": "string", "maxLength": 80},
    },
    "required": ["action", "why"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    check_installed()  # a missing install fails here, naming `make llm`
    with local_llm_server(startup_timeout=60) as running:
        yield running


def test_local_server_answers_a_json_schema_chat(server: LocalServer) -> None:
    llm = LLM(server.base_url, server.model, seed=0, max_tokens=96, timeout=120, max_retries=1)
    reply = llm.chat(
        [
            {"role": "system", "content": "You move in a maze. Answer in JSON."},
            {"role": "user", "content": "The exit is to the north. Which way do you go?"},
        ],
        json_schema=SCHEMA,
    )
    llm.close()
    assert reply.data["action"] in {"north", "south", "east", "west"}
    assert isinstance(reply.data["why"], str)
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert llm.structured_output == "json_object"  # llama-cpp-python's form, learnt on the first call


def test_a_prompt_over_the_context_is_a_recognised_400(server: LocalServer) -> None:
    llm = LLM(server.base_url, server.model, max_retries=3)
    with pytest.raises(LLMError, match="context length") as caught:
        llm.chat([{"role": "user", "content": "word " * 3000}], max_tokens=8)
    llm.close()
    assert is_context_overflow(caught.value)  # what summarize_experience shortens its prompt on


def test_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalLLMError, match="exited with code"), local_llm_server(model_path=tmp_path / "none.gguf"):
        pass


@pytest.mark.anyio
async def test_a_memrl_run_with_the_real_local_model(server: LocalServer, tmp_path: Path) -> None:
    """The whole path, nothing faked: SmolLM2 picks procedures and writes experiences, memrl-mcp learns."""
    llm = LLM(server.base_url, server.model, seed=0, timeout=120, max_retries=1)
    benchmark = ControlledBenchmark(families=2, tasks_per_family=1, agent="llm")
    config = RunConfig(benchmark="controlled", mode="memrl", epochs=2, benchmark_options={"agent": "llm"})
    with anyio.fail_after(300):
        records = await Runner(config, benchmark, RunDir(tmp_path / "run"), llm).run()
    assert len(records) == 4
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 and r.stored_id for r in records)
    # Epoch 2 recalled what epoch 1 stored: the memory the model's own experience became.
    stored = {r.task_id: r.stored_id for r in records if r.epoch == 1}
    assert all(stored[r.task_id] in r.memory_ids for r in records if r.epoch == 2)


def test_a_server_that_dies_while_serving_is_named_with_its_signal() -> None:
    """What `make llm`'s check says of a build that crashes on a chat (native AMX kernels did, on Intel Xeons):
    the signal and the server's log, where the client alone would only see a lost connection."""
    check_installed()
    died = r"llama_cpp.server died while serving \(killed by SIGSEGV\)"
    with pytest.raises(LocalLLMError, match=died), local_llm_server() as server:
        port = server.base_url.split(":")[-1].split("/")[0]
        (pid,) = [child for child in children(os.getpid()) if f"\0{port}\0" in command_line(child)]
        os.kill(pid, signal.SIGSEGV)
        llm = LLM(server.base_url, server.model, max_tokens=8, timeout=30, max_retries=0)
        with pytest.raises(LLMError):
            llm.chat([{"role": "user", "content": "Say hello."}])
        llm.close()


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Alive, not a zombie waiting for a parent that is gone to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_the_command_stops_the_llama_server_it_started(signum: signal.Signals) -> None:
    """``python -m memrl_harness.local_llm`` stopped as a service manager (SIGTERM), a closed terminal (SIGHUP) or
    ``kill -9`` (SIGKILL, which no handler sees) would stop it: the llama.cpp server it started stops too."""
    check_installed()
    port = free_port()
    command = subprocess.Popen(
        [sys.executable, "-m", "memrl_harness.local_llm", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started: list[int] = []
    try:
        ready = command.stdout.readline() if command.stdout else ""  # printed once the server answers
        assert ready.startswith("export MEMRL_LLM_BASE_URL="), command.stderr.read() if command.stderr else ""
        started = children(command.pid)
        (server,) = started
        assert running(server) and answers(port)
        command.send_signal(signum)
        command.wait(timeout=60)
        deadline = time.monotonic() + 60  # llama.cpp's own shutdown; not a timing assertion
        while running(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(server), f"the llama.cpp server {server} outlived its command ({signum.name})"
        assert not answers(port)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        for pid in filter(running, started):  # a server the command failed to stop: not left running
            os.kill(pid, signal.SIGKILL)
