"""BigCodeBench (instruct split): write a Python function from a description; its unit tests judge it.

Data: ``$MEMRL_SHARED_DATA/bigcodebench/bigcodebench_v0.1.4.jsonl`` (default ``MEMRL_SHARED_DATA``:
``<repo>/../shared/data``), or the ``data`` option. The default task set is the 300 tasks whose
solution and tests need only the standard library (``stdlib_only_ids.json``); ``split`` takes one
of MemRL's id splits instead, e.g. ``split=full_seed123:train`` (``splits/full_seed123.json``,
``train_ids``; ``:val`` for ``val_ids``). Those splits span all 1140 tasks: tasks that need
third-party packages (pandas, numpy, ...) only pass where those are installed in the interpreter
that runs the checks (``python`` option; default this one).

Episode: the LLM gets the full instruct prompt (with recalled memories: successes as examples to
follow, failures as mistakes to avoid) and answers with code; the code in its ```python fence
(the one defining the entry point, else the longest; the raw answer without a fence) is checked.
The memory key (``Task.intent``) is the instruct prompt cut to ``intent_chars`` (300) characters.

Checker (:func:`check`, in the style of BigCodeBench's ``untrusted_check``): solution + test code
are written to ``__test__.py`` in a fresh temporary working directory, compiled (a syntax error is
the outcome ``syntax_error``), executed as a module and its ``TestCases`` run with ``unittest``;
any failure or error is ``fail``, all passing is ``pass``, running past ``timeout`` (60 s; a few
tasks' tests take 10-60 s by design) is ``timeout``. Reward +1 on ``pass``, -1 otherwise.
Isolation (no security sandbox, as with BigCodeBench's own evaluation):

- its own session / process group (``start_new_session``), SIGKILLed as a whole afterwards,
  whatever the outcome, so no child it spawned outlives the check;
- a new PID namespace where the kernel allows it (root, or unprivileged user namespaces): the
  tests run as PID 1 of it, so even a child that left the process group (``setsid``) dies with it;
- a new network namespace with only its own loopback (brought up: tests serve on localhost),
  so no internet and not even the host's 127.0.0.1. As root
  ``unshare(CLONE_NEWNET)`` works; otherwise a user namespace is tried (``CLONE_NEWUSER``; the
  tests then run as an unmapped uid). What was achieved is recorded in the trajectory
  (``isolation: net+pid``); with ``network=require`` a check that cannot isolate the network
  fails loudly instead of running with network access;
- ``RLIMIT_AS`` of ``memory_mb`` (4096 MB) and no core files;
- its own ``HOME``/``TMPDIR`` (the working directory), removed afterwards.

The limits and namespaces are set by the child's own bootstrap (via ``ctypes``' ``unshare``),
before any untrusted code runs, rather than in a ``preexec_fn``, which is unsafe in the runner's
worker threads.

Measured here (canonical solution = ``code_prompt`` + ``canonical_solution``, 2 workers, timeout
240 s, all 327 ids of ``stdlib_only_ids.json``, about 3 minutes): 293/327 with this project's venv,
where 26 fail only because their *tests* import faker / pytz / pandas / requests_mock / pyfakefs;
319/327 (320 with the tempdir name fixed for task 1127) with ``python=`` a venv holding those five.
The rest need DNS / the network (176, 314, 1005), a non-root user (812, 832), another pandas (201,
609), or a clean host: 350 creates ``/non/existent/...`` on the host, so it passes only once. With
the default 60 s, 1040 and 1104 time out (their tests take 60-85 s). Stub bodies (``code_prompt``
+ ``pass``) pass 0/327 (1/327 with the extra packages: 272, whose tests mock everything).
Beware: there is no filesystem isolation (the code runs as the harness's user, root here, with
the working directory as cwd / HOME / TMPDIR only by convention).

Options (``--option KEY=VALUE``): ``data``, ``split``, ``ids`` (comma-separated task ids),
``limit`` (the first N tasks), ``timeout``,
``memory_mb``, ``network`` (``isolate`` best effort, ``require``), ``intent_chars``,
``max_tokens`` (2048), ``python``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.benchmarks.base import ENV_SHARED_DATA, Episode, Memory, Task, memory_sections, shared_data_root
from harness.llm import LLM

DATA_FILE = "bigcodebench/bigcodebench_v0.1.4.jsonl"
STDLIB_IDS = "bigcodebench/stdlib_only_ids.json"
SPLITS_DIR = "bigcodebench/splits"

OUTCOMES = ("pass", "fail", "timeout", "syntax_error")

# The child's bootstrap: limits and namespaces first, then the untrusted module and its tests.
# argv: result path, program path, memory limit in MB, network policy ("isolate" / "require").
_BOOTSTRAP = r"""
import ctypes, json, os, resource, sys
result_path, program_path, memory_mb, policy = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWUSER = 0x40000000, 0x20000000, 0x10000000

def write(payload):
    with open(result_path, "w") as out:
        json.dump(payload, out)

libc = ctypes.CDLL(None, use_errno=True)
isolation = []
if libc.unshare(CLONE_NEWNET | CLONE_NEWPID) == 0:
    isolation = ["net", "pid"]
elif libc.unshare(CLONE_NEWNET) == 0:
    isolation = ["net"]
elif libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID) == 0:
    isolation = ["user", "net", "pid"]
if "net" in isolation:  # bring the namespace's own loopback up (tests serve on localhost)
    import fcntl, socket, struct
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            flags = struct.unpack("16sH", fcntl.ioctl(probe, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
            fcntl.ioctl(probe, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))
    except OSError:
        pass
if "net" not in isolation and policy == "require":
    write({"status": "error", "isolation": "none", "details": {"isolation": "cannot unshare the network"}})
    sys.exit(3)
if "pid" in isolation:  # the next child is PID 1 of the new namespace: when it dies, all in it die
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
isolation = "+".join(isolation) or "none"

import builtins, types, unittest
sys.argv = [program_path]  # the code under test need not see where the verdict is written
with open(program_path) as source:
    code = source.read()
try:
    compiled = compile(code, program_path, "exec")
except (SyntaxError, ValueError) as exc:
    write({"status": "syntax_error", "isolation": isolation, "details": {"compile": repr(exc)}})
    sys.exit(0)
module = types.ModuleType("__test__")
module.__dict__.update({"__builtins__": builtins, "__file__": program_path, "__package__": None, "__doc__": None})
sys.modules["__test__"] = module
details = {}
try:
    exec(compiled, module.__dict__)
    suite = unittest.TestLoader().loadTestsFromTestCase(module.TestCases)
    result = unittest.TestResult()
    suite.run(result)
    for test, trace in result.failures + result.errors:
        details[test.id().split(".")[-1]] = trace[-2000:]
    if result.testsRun == 0:
        details["tests"] = "no test ran"
except BaseException as exc:
    details["module"] = repr(exc)[-2000:]
write({"status": "fail" if details else "pass", "isolation": isolation, "details": details})
sys.stdout.flush()
os._exit(0)
"""


@dataclass(frozen=True)
class CheckResult:
    """A check's outcome (one of :data:`OUTCOMES`), failing tests with their tracebacks, and cost."""

    status: str
    details: Mapping[str, str] = field(default_factory=dict)
    isolation: str = "none"
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def check(
    code: str,
    test: str,
    *,
    timeout: float = 60.0,
    memory_mb: int = 4096,
    network: str = "isolate",
    python: str | None = None,
) -> CheckResult:
    """Run ``test`` (a ``TestCases`` unittest class) against ``code`` in an isolated child process."""
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bcbcheck"))
    private = Path(tempfile.mkdtemp(prefix="bcbresult"))  # outside the working directory
    result_path, output_path = private / "result.json", private / "output.txt"
    program = workdir / "__test__.py"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv = [python or sys.executable, "-c", _BOOTSTRAP, str(result_path), str(program), str(memory_mb), network]
    try:
        program.write_text(code + "\n\n" + test)
        # Output goes to a file, not a pipe: a leftover child holding a pipe open would stall the read.
        with output_path.open("wb") as output:
            process = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(process.pid)
                process.wait()
                return CheckResult(
                    "timeout", {"timeout": f"still running after {timeout:g} s"}, seconds=_since(started)
                )
            finally:
                _kill_group(process.pid)  # whatever it left behind in its group
        try:
            payload = json.loads(result_path.read_text())
        except (OSError, ValueError):
            with output_path.open("rb") as out:
                out.seek(max(0, output_path.stat().st_size - 2000))
                tail = out.read().decode(errors="replace")
            return CheckResult(
                "fail",
                {"process": f"exit status {process.returncode}, no result; output: {tail}"},
                "?",
                _since(started),
            )
        status = payload.get("status")
        if status == "error":
            raise RuntimeError(f"BigCodeBench check refused to run: {payload.get('details')}")
        return CheckResult(status, payload.get("details") or {}, payload.get("isolation", "?"), _since(started))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _since(started: float) -> float:
    return time.perf_counter() - started


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(answer: str, entry_point: str = "task_func") -> str:
    """The code in an LLM answer: the python fence defining ``entry_point`` (else the longest
    python / unlabelled fence); the raw answer when it has no fence."""
    blocks = [body for lang, body in _FENCE.findall(answer) if lang.lower() in ("", "python", "py", "python3")]
    if not blocks:
        return answer.strip() + "\n"
    defining = [b for b in blocks if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\b", b, re.M)]
    return max(defining or blocks, key=len).strip() + "\n"


def load_rows(path: Path) -> dict[str, dict[str, Any]]:
    """BigCodeBench's jsonl rows by task id."""
    rows: dict[str, dict[str, Any]] = {}
    with path.open() as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                rows[row["task_id"]] = row
    return rows


class BigCodeBenchmark:
    """BigCodeBench instruct tasks, checked by their unit tests in an isolated process."""

    name = "bigcodebench"
    needs_llm = True

    def __init__(
        self,
        data: str | None = None,
        split: str | None = None,
        limit: int | str | None = None,
        ids: str | Sequence[str] | None = None,
        timeout: float | str = 60.0,
        memory_mb: int | str = 4096,
        network: str = "isolate",
        intent_chars: int | str = 300,
        max_tokens: int | str = 2048,
        python: str | None = None,
    ) -> None:
        root = shared_data_root()
        data_file = Path(data) if data else root / DATA_FILE
        if not data_file.is_file():
            raise ValueError(
                f"BigCodeBench data not found at {data_file} (set {ENV_SHARED_DATA} or --option data=PATH)"
            )
        if network not in ("isolate", "require"):
            raise ValueError(f"network: must be 'isolate' or 'require', got {network!r}")
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.network = network
        self.intent_chars = int(intent_chars)
        self.max_tokens = int(max_tokens)
        self.python = python
        if self.timeout <= 0 or self.memory_mb < 64 or self.intent_chars < 20:
            raise ValueError("timeout must be > 0, memory_mb >= 64, intent_chars >= 20")
        rows = load_rows(data_file)
        if ids is not None:
            wanted = [i.strip() for i in ids.split(",")] if isinstance(ids, str) else list(ids)
            unknown = [i for i in wanted if i not in rows]
            if unknown:
                raise ValueError(f"ids: not in the data: {', '.join(unknown)}")
            chosen = wanted
        else:
            chosen = self._ids(split, data_file.parent if data else root / "bigcodebench", rows)
        if limit is not None:
            chosen = chosen[: int(limit)]
        self._tasks = [self._task(rows[i]) for i in chosen]

    @staticmethod
    def _ids(split: str | None, folder: Path, rows: Mapping[str, Any]) -> list[str]:
        if split is None:
            path = folder / Path(STDLIB_IDS).name
            ids = json.loads(path.read_text())
        else:
            name, _, part = split.partition(":")
            part = part or "train"
            if part not in ("train", "val"):
                raise ValueError(f"split: part must be 'train' or 'val', got {part!r}")
            path = folder / "splits" / f"{name}.json"
            if not path.is_file():
                raise ValueError(f"split: no file {path}")
            ids = json.loads(path.read_text())[f"{part}_ids"]
        missing = [i for i in ids if i not in rows]
        if missing:
            raise ValueError(f"{path}: {len(missing)} ids not in the data, e.g. {missing[0]}")
        return list(ids)

    def _task(self, row: Mapping[str, Any]) -> Task:
        prompt = row["instruct_prompt"].strip()
        intent = prompt if len(prompt) <= self.intent_chars else prompt[: self.intent_chars].rstrip() + " ..."
        return Task(id=row["task_id"], intent=intent, data=dict(row))

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def check(self, task: Task, code: str) -> CheckResult:
        return check(
            code,
            task.data["test"],
            timeout=self.timeout,
            memory_mb=self.memory_mb,
            network=self.network,
            python=self.python,
        )

    def prompt(self, task: Task, memories: Sequence[Memory]) -> str:
        parts = memory_sections(memories)
        parts.append(task.data["instruct_prompt"].strip())
        parts.append("Answer with the complete, self-contained Python code in one ```python code block.")
        return "\n\n".join(parts)

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        if llm is None:
            raise ValueError("bigcodebench needs an LLM")
        messages = [
            {"role": "system", "content": "You are an expert Python programmer."},
            {"role": "user", "content": self.prompt(task, memories)},
        ]
        reply = llm.chat(messages, max_tokens=self.max_tokens)
        code = extract_code(reply.text, task.data.get("entry_point") or "task_func")
        result = self.check(task, code)
        problems = "\n".join(f"{name}: {trace.strip()[-600:]}" for name, trace in list(result.details.items())[:3])
        trajectory = (
            f"Task: {task.intent}\n\nCode written:\n```python\n{code[:4000]}```\n\n"
            f"Unit tests: {result.status} ({result.seconds:.1f} s, isolation: {result.isolation})"
            + (f"\n{problems}" if problems else "")
        )
        return Episode(
            success=result.passed,
            reward=1.0 if result.passed else -1.0,
            steps=1,
            trajectory=trajectory,
            usage=reply.usage,
        )
