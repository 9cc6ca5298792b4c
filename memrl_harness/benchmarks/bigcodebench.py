"""BigCodeBench (instruct split): write a Python function from a description; its unit tests judge it.

Data: ``bigcodebench/bigcodebench_v0.1.4.jsonl`` of the data folder (``memrl_harness.install.shared_data_root``),
or the ``data`` option. The default task set is the 300 tasks whose
solution and tests need only the standard library (``stdlib_only_ids.json``); ``split`` takes one
of MemRL's id splits instead, e.g. ``split=full_seed123:train`` (``splits/full_seed123.json``,
``train_ids``; ``:val`` for ``val_ids``). Those splits span all 1140 tasks: tasks that need
third-party packages (pandas, numpy, ...) only pass where those are installed in the interpreter
that runs the checks (``python`` option; default this one).

Episode: the LLM gets the full instruct prompt (with recalled memories: successes as examples to
follow, failures as mistakes to avoid) and answers with code; the code in its ```python fence
(the one defining the entry point, else the longest; the raw answer without a fence) is checked.
The memory key (``Task.intent``) is the instruct prompt cut to ``intent_chars`` (300) characters.

Checker (:func:`check`, in the style of BigCodeBench's ``untrusted_check``): solution + test code run as one
module ``__test__`` (a syntax error is the outcome ``syntax_error``), then each test of its ``TestCases`` (with
``setUp`` / ``tearDown`` / cleanups, and ``setUpClass`` / ``tearDownClass``); any failure or error is ``fail``,
all passing is ``pass``, running past ``timeout`` (60 s; a few tasks' tests take 10-60 s by design) is
``timeout``. Reward +1 on ``pass``, -1 otherwise.

Each check runs in its own bubblewrap jail (:mod:`memrl_harness.backends.jail`, the one LLB OS uses):

- as uid 1000 of a user namespace with no capabilities (host uid 1,001,000), unable to make more user
  namespaces, under the seccomp filter of :mod:`memrl_harness.backends.seccomp` (no ``setns``, ``unshare``, mount,
  ptrace, keyring, BPF, io_uring, vsock...);
- its own mount namespace: a read-only tmpfs root with ``/usr`` (and its ``/bin``, ``/lib`` links), the Python
  environment that runs the checks (``python`` option: its prefix and base prefix) and a few ``/etc`` files
  bound read-only, ``/home/sandbox`` (its working folder, ``HOME`` and ``TMPDIR``) and ``/tmp`` private tmpfs
  folders; no other host file is visible, none can be written. The jail's own folders (``/proc``, ``/dev``,
  ``/home/sandbox``, ``/tmp``) are mounted first and the host's folders bound over them, so an environment under
  one of them (a clone in ``/tmp``, a venv in ``/dev/shm``) is bound at its own path: the jail then sees the
  names of the folders leading to it and nothing else of them (none of the host's ``/tmp``). An environment that
  is one of those folders or holds one (``python`` in ``/tmp`` itself, ``/home``, ``/``) would cover the jail's
  private folder with the host's: it is refused;
- its own PID namespace and ``/proc`` (no host process is visible: no ``/proc/*/environ`` to read, no
  ``/proc/N/ns`` to enter), network namespace (only its own loopback, up: tests serve on localhost), IPC and
  UTS namespaces; an environment of ``PATH`` (the interpreter's folder first), ``HOME``, ``TMPDIR``, ``LANG``,
  ``OMP_NUM_THREADS``, ``PYTHONDONTWRITEBYTECODE`` only;
- one memory limit (``memory_mb``, 4096 MB) for all its processes together (a cgroup), and the same as
  ``RLIMIT_AS`` per process (an allocation fails with ``MemoryError`` rather than waking the OOM killer);
  ``pids`` (512) processes; no real-time scheduling; everything killed at the end (the cgroup);
- the verdict is made here, outside the jail, from the report a runner writes on an inherited pipe (no file,
  no path in any command line): one line per test as it ends, then an end mark. Its runner calls each test
  itself, not through ``unittest.TestResult`` / ``TextTestRunner`` (patching those changes nothing), exiting
  early (``sys.exit``, ``os._exit``, a crash, the OOM killer) leaves the report incomplete, which is ``fail``,
  and every ``test*`` method of ``TestCases`` that the test source defines (read here with ``ast``) must be
  reported passed.

What a candidate can still do, since BigCodeBench runs it in the same interpreter as the tests it must pass:
patch what the tests call (``unittest.TestCase.assert*``, builtins, the modules they import), return objects
whose ``__eq__`` always holds, or reach the runner's pipe (it is a file descriptor of its own process) and write
a complete forged report. These need code written to cheat, not to solve; they stay inside the jail.

How the check was validated (the canonical solutions pass, stub bodies fail, and the few tasks that need the
network) and what a check costs: docs/harness.md and docs/performance.md.

Options (``--option KEY=VALUE``): :class:`BigCodeBenchOptions` (``memrl-harness options bigcodebench``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from memrl_harness.backends.cgroups import FLOORS, Cgroups, Limits
from memrl_harness.backends.jail import Staging, launch, require_jail
from memrl_harness.backends.seccomp import bpf_program
from memrl_harness.benchmarks.base import Episode, Memory, Task, memory_sections
from memrl_harness.benchmarks.options import BenchmarkOptions, TaskIds
from memrl_harness.install import data_hint, shared_data_root
from memrl_harness.llm import LLM

DATA_FILE = "bigcodebench/bigcodebench_v0.1.4.jsonl"
STDLIB_IDS = "bigcodebench/stdlib_only_ids.json"
SPLITS_DIR = "bigcodebench/splits"

OUTCOMES = ("pass", "fail", "timeout", "syntax_error")
WORKDIR = "/home/sandbox"  # the check's private working folder, HOME and TMPDIR (a tmpfs)
PRIVATE = ("/proc", "/dev", WORKDIR, "/tmp")  # the jail's own folders, which no host folder may cover
# Host files a unit test may read (name lookups, time zones, certificates, MIME types, services).
ETC_FILES: tuple[str, ...] = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "ld.so.cache",
    "mime.types",
)
ETC_FILES += ("protocols", "services", "ssl", "ca-certificates")

# The runner, run in the jail by the checks' Python: reads "code NUL test" on stdin, reports on the pipe whose
# descriptor is its first argument.
# Everything it needs is bound before the candidate's code runs.
_RUNNER = r"""
import json, os, resource, sys, traceback, types, unittest
REPORT, MEMORY = int(sys.argv[1]), int(sys.argv[2])
write, dumps, format_exc, getattr_, BaseException_ = os.write, json.dumps, traceback.format_exc, getattr, BaseException

def emit(**payload):
    write(REPORT, (dumps(payload) + "\n").encode())

code, _, test = sys.stdin.read().partition("\0")
sys.stdin.close()
resource.setrlimit(resource.RLIMIT_AS, (MEMORY << 20, MEMORY << 20))
try:
    compiled = compile(code + "\n\n" + test, "__test__.py", "exec")
except (SyntaxError, ValueError) as exc:
    emit(syntax_error=repr(exc))
    os._exit(0)
module = types.ModuleType("__test__")
module.__dict__.update({"__file__": os.path.abspath("__test__.py"), "__builtins__": __builtins__})
sys.modules["__test__"] = module
sys.argv = ["__test__.py"]
try:
    exec(compiled, module.__dict__)
    cases = module.TestCases
    names = unittest.TestLoader().getTestCaseNames(cases)
except BaseException_:
    emit(module_error=format_exc()[-2000:])
    os._exit(0)
try:
    cases.setUpClass()
    ready = None
except BaseException_:
    ready = format_exc()[-2000:]
for name in names:
    error = ready
    if error is None:
        try:
            case = cases(name)
            try:
                case.setUp()
                try:
                    getattr_(case, name)()
                finally:
                    case.tearDown()
            finally:
                case.doCleanups()
        except BaseException_:
            error = format_exc()[-2000:]
    emit(test=name, error=error)
try:
    cases.tearDownClass()
except BaseException_:
    emit(test="tearDownClass", error=format_exc()[-2000:])
emit(done=len(names))
sys.stdout.flush()
os._exit(0)
"""


@dataclass(frozen=True)
class CheckResult:
    """A check's outcome (one of :data:`OUTCOMES`), failing tests with their tracebacks, and cost."""

    status: str
    details: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@functools.cache
def python_folders(python: str) -> tuple[str, ...]:
    """The folders an interpreter's environment lives in (prefix, base prefix, resolved), outside ``/usr``;
    a ``ValueError`` naming ``python`` for one that would cover a folder of the jail's own (:data:`PRIVATE`)."""
    probe = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
    found = json.loads(subprocess.run([python, "-I", "-c", probe], capture_output=True, check=True, text=True).stdout)
    folders = {str(Path(p).resolve()) for p in found} | set(found)
    folders = {f for f in folders if f != "/usr" and not f.startswith("/usr/")}
    for folder in sorted(folders):
        covered = [p for p in PRIVATE if p == folder or p.startswith(folder.rstrip("/") + "/")]
        if covered:
            raise ValueError(
                f"python: {python} lives in {folder}, which would show the host's {covered[0]} to the checked "
                "code instead of the jail's own: use an environment in a folder of its own"
            )
    return tuple(sorted(folders))


def test_names(test: str) -> set[str]:
    """The ``test*`` methods the source defines on ``TestCases`` (which its report must all pass)."""
    with contextlib.suppress(SyntaxError, ValueError), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a test's invalid escape sequences are its own business
        for node in ast.walk(ast.parse(test)):
            if isinstance(node, ast.ClassDef) and node.name == "TestCases":
                return {
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test")
                }
    return set()


def check(
    code: str,
    test: str,
    *,
    timeout: float = 60.0,
    memory_mb: int = 4096,
    pids: int = 512,
    python: str | None = None,
) -> CheckResult:
    """Run ``test`` (a ``TestCases`` unittest class) against ``code`` in a fresh jail (see the module doc)."""
    started = time.perf_counter()
    interpreter = python or sys.executable
    folders = python_folders(interpreter)
    limits = Limits(memory_mb=memory_mb, pids=pids, disk_mb=memory_mb)
    staging = Staging(Path(tempfile.mkdtemp(prefix="memrl-bcb-")))
    staging.folder.chmod(0o711)  # the jail's root (host uid 1,000,000) passes through to its mount point
    args = _jail_args(interpreter, folders, staging, limits)
    cgroups = Cgroups(limits, prefix="memrl-bcb")
    report_read, report_write = os.pipe()
    with tempfile.TemporaryFile() as rules, tempfile.TemporaryFile() as output:
        rules.write(bpf_program())
        rules.seek(0)
        args += ["--seccomp", str(rules.fileno())]
        args += [interpreter, "-c", _RUNNER, str(report_write), str(memory_mb)]
        try:
            process = launch(
                args,
                cgroups,
                limits,
                staging=staging,
                binds=folders,
                pass_fds=(rules.fileno(), report_write),
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        except BaseException:
            os.close(report_read)
            os.close(report_write)
            cgroups.destroy()
            shutil.rmtree(staging.folder, ignore_errors=True)
            raise
        os.close(report_write)
        lines: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(report_read, lines), daemon=True)
        reader.start()
        try:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                process.stdin.write((code + "\0" + test).encode())
                process.stdin.close()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return CheckResult("timeout", {"timeout": f"still running after {timeout:g} s"}, _since(started))
        finally:
            cgroups.destroy()  # whatever it left behind
            process.wait()
            reader.join(timeout=5)
            shutil.rmtree(staging.folder, ignore_errors=True)
        output.seek(max(0, output.seek(0, os.SEEK_END) - 2000))
        tail = output.read().decode(errors="replace")
    return _verdict(lines, test, process.returncode, tail, _since(started))


def _jail_args(interpreter: str, folders: Sequence[str], staging: Staging, limits: Limits) -> list[str]:
    """bwrap's arguments for a check (module doc): what it sees, its namespaces, identity and environment.

    bwrap mounts in the order given: the jail's own folders come first, so a host folder bound below one of them
    (a venv under ``/tmp``) is bound over that tmpfs rather than hidden by it."""
    size = str(limits.disk_mb << 20)
    args = ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", WORKDIR, "--size", size, "--tmpfs", "/tmp"]
    args += ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "sbin", "lib", "lib64"):
        if Path("/" + link).is_symlink():
            args += ["--symlink", os.readlink("/" + link), "/" + link]
        elif Path("/" + link).is_dir():
            args += ["--ro-bind", "/" + link, "/" + link]
    for name in ETC_FILES:
        if Path("/etc", name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for index, folder in enumerate(folders):
        args += ["--ro-bind", staging.bound(index), folder]
    args += ["--remount-ro", "/", "--chdir", WORKDIR, "--hostname", "bigcodebench", "--die-with-parent"]
    args += ["--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000", "--disable-userns", "--new-session"]
    path = f"{Path(interpreter).parent}:/usr/local/bin:/usr/bin:/bin"  # `python` is the checks' interpreter
    env = {"PATH": path, "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8"}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    args.append("--clearenv")
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def _drain(fd: int, lines: list[bytes]) -> None:
    with open(fd, "rb") as report:
        lines.extend(report)


def _verdict(lines: list[bytes], test: str, exit_code: int, tail: str, seconds: float) -> CheckResult:
    """The outcome from the runner's report: complete, every test passed, every defined test reported."""
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            return CheckResult("fail", {"report": f"unreadable report line {line[:200]!r}"}, seconds)
    if entries and "syntax_error" in entries[0]:
        return CheckResult("syntax_error", {"compile": str(entries[0]["syntax_error"])}, seconds)
    details: dict[str, str] = {}
    reported: list[str] = []
    for entry in entries:
        if "module_error" in entry:
            details["module"] = str(entry["module_error"])
        elif "test" in entry:
            reported.append(str(entry["test"]))
            if entry.get("error") is not None:
                details[str(entry["test"])] = str(entry["error"])
    done = [e["done"] for e in entries if "done" in e]
    if done != [len([r for r in reported if r != "tearDownClass"])] and not details:
        details["process"] = f"the tests did not run to the end (exit status {exit_code}); output: {tail}"
    if len(set(reported)) != len(reported):
        details["report"] = "a test was reported twice"
    missing = test_names(test) - set(reported)
    if missing:
        details.setdefault("tests", f"not run: {', '.join(sorted(missing))}")
    if not reported and not details:
        details["tests"] = "no test ran"
    return CheckResult("fail" if details else "pass", details, seconds)


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


class BigCodeBenchOptions(BenchmarkOptions):
    """BigCodeBench's options; the module docstring says what the checks' limits guard."""

    data: Path | None = Field(None, description=f"the tasks' jsonl (default: {DATA_FILE} of the shared data)")
    split: str | None = Field(
        None, description="one of MemRL's id splits, NAME[:train|val] (default: the stdlib-only tasks)"
    )
    ids: TaskIds | None = Field(None, description="these tasks only, comma-separated (over split)")
    limit: int | None = Field(None, ge=1, description="the first N tasks only")
    timeout: float = Field(60.0, gt=0, description="seconds a check may run")
    memory_mb: int = Field(4096, ge=64, description="memory of a check, all its processes together")
    pids: int = Field(512, ge=FLOORS["pids"], description="processes and threads of a check")
    intent_chars: int = Field(300, ge=20, description="the memory key: the prompt cut to this many characters")
    max_tokens: int = Field(2048, ge=1, description="the answer's length limit")
    python: str | None = Field(None, description="the interpreter that runs the checks (default: this one)")

    @field_validator("split")
    @classmethod
    def _train_or_val(cls, split: str | None) -> str | None:
        part = (split or "").partition(":")[2]
        if part not in ("", "train", "val"):
            raise ValueError(f"the part after ':' must be train or val, got {part!r}")
        return split


class BigCodeBenchmark:
    """BigCodeBench instruct tasks, checked by their unit tests in an isolated process."""

    name = "bigcodebench"
    needs_llm = True
    Options = BigCodeBenchOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`BigCodeBenchOptions`, as text (``--option limit=20``) or typed."""
        options = self.options = BigCodeBenchOptions.parse(self.name, values)
        root = shared_data_root()
        data_file = options.data or root / DATA_FILE
        if not data_file.is_file():
            raise ValueError(data_hint("BigCodeBench data", data_file))
        python_folders(options.python or sys.executable)  # an interpreter the jail cannot hold fails here
        require_jail()  # fails here, clearly, rather than every check
        rows = load_rows(data_file)
        if options.ids is not None:
            unknown = [i for i in options.ids if i not in rows]
            if unknown:
                raise ValueError(f"ids: not in the data: {', '.join(unknown)}")
            chosen = list(options.ids)
        else:
            chosen = self._ids(options.split, data_file.parent if options.data else root / "bigcodebench", rows)
        self._tasks = [self._task(rows[i]) for i in chosen[: options.limit]]

    @staticmethod
    def _ids(split: str | None, folder: Path, rows: Mapping[str, Any]) -> list[str]:
        if split is None:
            path = folder / Path(STDLIB_IDS).name
            ids = json.loads(path.read_text())
        else:
            name, _, part = split.partition(":")
            part = part or "train"
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
        cut = self.options.intent_chars
        intent = prompt if len(prompt) <= cut else prompt[:cut].rstrip() + " ..."
        return Task(id=row["task_id"], intent=intent, data=dict(row))

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def check(self, task: Task, code: str) -> CheckResult:
        return check(
            code,
            task.data["test"],
            timeout=self.options.timeout,
            memory_mb=self.options.memory_mb,
            pids=self.options.pids,
            python=self.options.python,
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
        reply = llm.chat(messages, max_tokens=self.options.max_tokens)
        code = extract_code(reply.text, task.data.get("entry_point") or "task_func")
        result = self.check(task, code)
        problems = "\n".join(f"{name}: {trace.strip()[-600:]}" for name, trace in list(result.details.items())[:3])
        trajectory = (
            f"Task: {task.intent}\n\nCode written:\n```python\n{code[:4000]}```\n\n"
            f"Unit tests: {result.status} ({result.seconds:.1f} s)" + (f"\n{problems}" if problems else "")
        )
        return Episode(
            success=result.passed,
            reward=1.0 if result.passed else -1.0,
            steps=1,
            trajectory=trajectory,
            usage=reply.usage,
        )
