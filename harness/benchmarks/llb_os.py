"""LifelongAgentBench OS interaction: bash tasks in a throwaway Linux system, judged by a script.

Data: ``$MEMRL_SHARED_DATA/llb/os_interaction_train.json`` (350 tasks; ``data`` option), a dict
id -> ``instruction``, ``initialization_command_item``, ``evaluation_info`` (the
``evaluation_command_item`` and ``ground_truth_command_item`` bash scripts) and ``skill_list``.
``Task.intent`` is the instruction; ``Task.type`` the first skill.

Sandbox (:class:`Sandbox`, one per episode; Linux, run as root, ``make sandbox`` installs it):

- the root filesystem is a Debian bookworm minbase built once by ``mmdebstrap`` (``rootfs``
  option, ``$MEMRL_LLB_ROOTFS``, default ``<repo>/.venv/llb-rootfs``), never written: an
  overlayfs with its upper / work directories in a fresh temporary folder is mounted over it
  *inside a private mount namespace* (``unshare --mount``), so the host's mount table never
  sees it and it vanishes with the sandbox's last process;
- ``bwrap`` binds the overlay as ``/`` with its own ``/proc`` and ``/dev``, new PID, network
  (loopback only), IPC and UTS namespaces, no user namespace, root's capabilities kept
  except those that reach beyond the namespaces (``CAP_SYS_ADMIN``: no mounts; ``CAP_MKNOD``:
  no device nodes; ``CAP_DAC_READ_SEARCH``: no ``open_by_handle_at``; modules, raw I/O, ...);
  nothing of the host is bound in;
- inside it a small Python server (the holder) reads one JSON request per line on its stdin and
  runs each command as ``bash -c`` in a new session, output captured through a pipe (first
  ``OUTPUT_LIMIT`` bytes kept), so every command of a task runs in the same system: files,
  ``/tmp``, users and background jobs (``cmd &``) persist between commands. Commands are never
  injected from the host with ``nsenter`` (``nsenter -w/path`` resolves the path on the host);
- a command running past its timeout has its process group SIGKILLed (``timed_out``);
- teardown SIGKILLs the bwrap process group; PID 1 of the sandbox dying kills everything in it;
  the temporary folder (upper layer) is then removed.

Episode (LLB's loop): up to ``max_rounds`` (10) rounds; each round the LLM answers JSON
``{thought, action: bash|answer|finish, content}``; a ``bash`` command runs in the sandbox and
its output (cut to ``output_chars``) is the next user message; ``answer`` / ``finish`` end the
episode. Then the evaluation script runs in the same sandbox: exit status 0 is success (reward
``reward_success``, 1), anything else failure (``reward_failure``, 0; configs/llb.yaml).

Measured here (all 350 tasks, each in a fresh sandbox, 8 workers, 42 s): init -> ground truth ->
evaluation passes 350/350; init -> evaluation (no ground truth) passes 0/350. A sandbox starts
(overlay mount, bwrap, holder answering) in about 0.1 s.

Docker backend (``backend=docker``; default ``backend=bwrap``, the sandbox above): each task in a
fresh container of ``image`` (default ``ubuntu:22.04``; LifelongAgentBench builds ``local-os/default``
from an Ubuntu base) with no network, as LLB does: :class:`harness.benchmarks.llb_docker.DockerSandbox`.
Needs ``pip install 'memrl-mcp[docker]'`` and a reachable Docker engine (a clear error otherwise).

Options: ``backend``, ``image``, ``data``, ``rootfs``, ``ids``, ``limit``, ``max_rounds``, ``command_timeout`` (20 s),
``eval_timeout`` (60 s), ``output_chars`` (800), ``max_tokens`` (512), ``reward_success``,
``reward_failure``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.benchmarks.base import ENV_SHARED_DATA, Episode, Memory, Task, memory_sections, shared_data_root
from harness.llm import LLM, LLMFormatError, Usage

ENV_ROOTFS = "MEMRL_LLB_ROOTFS"
DATA_FILE = "llb/os_interaction_train.json"
OUTPUT_LIMIT = 65536
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Capabilities that act beyond the sandbox's namespaces (or make devices / mounts): dropped.
DROPPED_CAPS = (
    "CAP_SYS_ADMIN",
    "CAP_MKNOD",
    "CAP_DAC_READ_SEARCH",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_BOOT",
    "CAP_SYS_TIME",
    "CAP_SYS_PTRACE",
    "CAP_NET_ADMIN",
    "CAP_MAC_ADMIN",
    "CAP_MAC_OVERRIDE",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_CONTROL",
    "CAP_BPF",
    "CAP_PERFMON",
)

# The holder: runs inside the sandbox (the rootfs' python3), one JSON request per stdin line
# ({"script", "timeout"}), one JSON answer per stdout line ({"exit_code", "output", "timed_out"}).
_SERVER = r"""
import json, os, signal, subprocess, sys, threading
LIMIT = int(sys.argv[1])
ENV = {"PATH": sys.argv[2], "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
       "LANG": "C.UTF-8", "TERM": "xterm"}
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

def drain(fd, kept, done):
    size = 0
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        if size < LIMIT:
            kept.append(chunk[: LIMIT - size])
        size += len(chunk)
    os.close(fd)
    done.set()

out = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    read_fd, write_fd = os.pipe()
    kept, done = [], threading.Event()
    try:
        process = subprocess.Popen(["/bin/bash", "-c", request["script"]], stdin=subprocess.DEVNULL,
                                   stdout=write_fd, stderr=write_fd, cwd=request.get("cwd", "/"), env=ENV,
                                   start_new_session=True)
    except OSError as exc:
        os.close(read_fd); os.close(write_fd)
        out.write(json.dumps({"exit_code": 127, "output": repr(exc), "timed_out": False}) + "\n"); out.flush()
        continue
    os.close(write_fd)
    # A background job may hold the pipe open: the reader keeps draining (and discarding) it.
    threading.Thread(target=drain, args=(read_fd, kept, done), daemon=True).start()
    timed_out = False
    try:
        code = process.wait(timeout=request["timeout"])
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        code = process.wait()
    done.wait(0.2)
    text = b"".join(kept).decode("utf-8", "replace")
    out.write(json.dumps({"exit_code": code, "output": text, "timed_out": timed_out}) + "\n")
    out.flush()
"""


@dataclass(frozen=True)
class CommandResult:
    """One command's exit status (negative: killed by that signal), output and whether it timed out."""

    exit_code: int
    output: str
    timed_out: bool = False
    seconds: float = 0.0


class SandboxError(RuntimeError):
    """The sandbox could not start or its holder died."""


def default_rootfs() -> Path:
    """``$MEMRL_LLB_ROOTFS``, else ``<repo>/.venv/llb-rootfs`` (where ``make sandbox`` builds it)."""
    env = os.environ.get(ENV_ROOTFS)
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".venv" / "llb-rootfs"


def check_prerequisites(rootfs: Path) -> None:
    """Raise with what is missing (``make sandbox`` installs all of it)."""
    problems = []
    for tool in ("bwrap", "unshare", "mount"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found")
    if not (rootfs / "usr" / "bin" / "python3").exists():
        problems.append(f"no root filesystem at {rootfs} (set {ENV_ROOTFS} or --option rootfs=PATH)")
    if os.geteuid() != 0:
        problems.append("the sandbox needs root (overlay mount, namespaces)")
    if problems:
        raise SandboxError("LLB OS sandbox unavailable: " + "; ".join(problems) + " -- run `make sandbox`")


class Sandbox:
    """A throwaway Linux system over ``rootfs``: see the module doc. Use as a context manager."""

    def __init__(self, rootfs: str | Path | None = None, command_timeout: float = 20.0) -> None:
        self.rootfs = Path(rootfs) if rootfs else default_rootfs()
        check_prerequisites(self.rootfs)
        self.command_timeout = float(command_timeout)
        self.dir = Path(tempfile.mkdtemp(prefix="llb-os-"))
        self._lock = threading.Lock()
        self._closed = False
        upper, work, merged = self.dir / "upper", self.dir / "work", self.dir / "merged"
        for folder in (upper, work, merged):
            folder.mkdir()
        bwrap = ["bwrap", "--bind", str(merged), "/", "--proc", "/proc", "--dev", "/dev"]
        bwrap += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        bwrap += ["--hostname", "llb-os", "--die-with-parent", "--chdir", "/", "--clearenv"]
        bwrap += ["--setenv", "PATH", PATH]  # root keeps its capabilities (no --cap-add ALL: it undoes drops)
        for cap in DROPPED_CAPS:
            bwrap += ["--cap-drop", cap]
        bwrap += ["/usr/bin/python3", "-I", "-c", _SERVER, str(OUTPUT_LIMIT), PATH]
        options = f"lowerdir={self.rootfs},upperdir={upper},workdir={work}"
        script = 'mount -t overlay overlay -o "$1" "$2" && shift 2 && exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", options, str(merged)]
        self._stderr = (self.dir / "stderr").open("wb")
        try:
            self.process = subprocess.Popen(
                argv + bwrap,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,
                text=True,
                encoding="utf-8",
            )
        except BaseException:
            self._stderr.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        try:
            probe = self.run("echo ready", timeout=30)
        except BaseException:
            self.close()
            raise
        if probe.output.strip() != "ready":
            self.close()
            raise SandboxError(f"sandbox did not start: {probe}")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run ``script`` with ``bash -c`` inside the sandbox; its process group dies at the timeout."""
        limit = self.command_timeout if timeout is None else float(timeout)
        started = time.monotonic()
        with self._lock:
            if self._closed or self.process.poll() is not None:
                raise SandboxError(f"sandbox is not running: {self._stderr_tail()}")
            assert self.process.stdin is not None and self.process.stdout is not None
            try:
                self.process.stdin.write(json.dumps({"script": script, "timeout": limit}) + "\n")
                self.process.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise SandboxError(f"sandbox holder gone: {exc!r} {self._stderr_tail()}") from exc
            # The holder enforces the timeout; the host-side guard only catches a hung holder.
            guard = threading.Timer(limit + 30, self._kill)
            guard.start()
            try:
                line = self.process.stdout.readline()
            finally:
                guard.cancel()
        if not line:
            raise SandboxError(f"sandbox holder died: {self._stderr_tail()}")
        answer = json.loads(line)
        return CommandResult(
            int(answer["exit_code"]), answer["output"], bool(answer["timed_out"]), time.monotonic() - started
        )

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "stderr").read_text(errors="replace")[-2000:]
        return ""

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill everything in the sandbox and remove its files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._kill()  # unshare -> bwrap (monitor) -> bwrap (PID 1): the sandbox dies with PID 1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


SYSTEM_PROMPT = (
    "You are an assistant that operates a Linux (Debian) machine as root through bash, one command "
    "at a time, to accomplish the user's task. Each turn answer with JSON: "
    '{"thought": your reasoning, "action": "bash" | "answer" | "finish", "content": ...}. '
    'With "bash", content is a bash script to run; you will see its output. With "answer", content '
    'is the answer to a question. With "finish", the task is done (content may be empty). '
    "Commands are not interactive: no editors or prompts waiting for input."
)

ACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "thought": {"type": "string"},
        "action": {"type": "string", "enum": ["bash", "answer", "finish"]},
        "content": {"type": "string"},
    },
    "required": ["thought", "action", "content"],
    "additionalProperties": False,
}


class LLBOSBenchmark:
    """LifelongAgentBench OS interaction tasks, each in its own :class:`Sandbox`."""

    name = "llb-os"
    needs_llm = True

    def __init__(
        self,
        data: str | None = None,
        rootfs: str | None = None,
        ids: str | Sequence[str] | None = None,
        limit: int | str | None = None,
        max_rounds: int | str = 10,
        command_timeout: float | str = 20.0,
        eval_timeout: float | str = 60.0,
        output_chars: int | str = 800,
        max_tokens: int | str = 512,
        reward_success: float | str = 1.0,
        reward_failure: float | str = 0.0,
        backend: str = "bwrap",
        image: str | None = None,
        docker_client: Any = None,
    ) -> None:
        data_file = Path(data) if data else shared_data_root() / DATA_FILE
        if not data_file.is_file():
            raise ValueError(f"LLB OS data not found at {data_file} (set {ENV_SHARED_DATA} or --option data=PATH)")
        if backend not in ("bwrap", "docker"):
            raise ValueError(f"backend: bwrap or docker, not {backend!r}")
        self.backend = backend
        self.rootfs = Path(rootfs) if rootfs else default_rootfs()
        self.system_prompt = SYSTEM_PROMPT
        if backend == "bwrap":
            check_prerequisites(self.rootfs)
        else:
            from harness.benchmarks import llb_docker

            self.image = image or llb_docker.DEFAULT_OS_IMAGE
            self.docker = llb_docker.docker_client(docker_client)  # fails here, clearly, without Docker
            name = self.image.lower()
            distro = "Debian" if "debian" in name else "Ubuntu" if ("ubuntu" in name or "local-os" in name) else ""
            self.system_prompt = SYSTEM_PROMPT.replace("Linux (Debian)", f"Linux ({distro})" if distro else "Linux")
        self.max_rounds = int(max_rounds)
        self.command_timeout = float(command_timeout)
        self.eval_timeout = float(eval_timeout)
        self.output_chars = int(output_chars)
        self.max_tokens = int(max_tokens)
        self.reward_success = float(reward_success)
        self.reward_failure = float(reward_failure)
        if self.max_rounds < 1 or self.command_timeout <= 0 or self.eval_timeout <= 0 or self.output_chars < 50:
            raise ValueError("max_rounds >= 1, timeouts > 0, output_chars >= 50")
        rows: dict[str, dict[str, Any]] = json.loads(data_file.read_text())
        order = sorted(rows, key=lambda k: (int(k), k) if k.isdigit() else (1 << 62, k))
        if ids is not None:
            wanted = [i.strip() for i in ids.split(",")] if isinstance(ids, str) else list(ids)
            unknown = [i for i in wanted if i not in rows]
            if unknown:
                raise ValueError(f"ids: not in the data: {', '.join(unknown)}")
            order = wanted
        if limit is not None:
            order = order[: int(limit)]
        self._tasks = [self._task(i, rows[i]) for i in order]

    @staticmethod
    def _task(task_id: str, row: Mapping[str, Any]) -> Task:
        skills = list(row.get("skill_list") or [])
        return Task(id=task_id, intent=row["instruction"].strip(), data=dict(row), type=skills[0] if skills else None)

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    @staticmethod
    def script(task: Task, kind: str) -> str:
        """The task's ``init``, ``ground_truth`` or ``evaluation`` bash script ('' when absent)."""
        if kind == "init":
            item = task.data.get("initialization_command_item")
        else:
            item = (task.data.get("evaluation_info") or {}).get(f"{kind}_command_item")
        return str((item or {}).get("script") or "")

    def sandbox(self) -> Sandbox:
        if self.backend == "docker":
            from harness.benchmarks.llb_docker import DockerSandbox

            return DockerSandbox(self.image, self.command_timeout, self.docker)  # type: ignore[return-value]
        return Sandbox(self.rootfs, self.command_timeout)

    def initialize(self, box: Sandbox, task: Task) -> CommandResult | None:
        init = self.script(task, "init")
        return box.run(init, timeout=self.eval_timeout) if init.strip() else None

    def evaluate(self, box: Sandbox, task: Task) -> CommandResult:
        return box.run(self.script(task, "evaluation"), timeout=self.eval_timeout)

    def prompt(self, task: Task, memories: Sequence[Memory]) -> str:
        parts = memory_sections(memories)
        parts.append(f"Task: {task.intent}")
        parts.append(f"You have at most {self.max_rounds} rounds. Answer with the JSON object only.")
        return "\n\n".join(parts)

    def _shown(self, result: CommandResult) -> str:
        text = result.output
        if len(text) > self.output_chars:
            text = text[: self.output_chars] + f"\n[truncated: {len(result.output)} characters in all]"
        status = f"timed out after {self.command_timeout:g} s" if result.timed_out else f"exit code {result.exit_code}"
        return f"The output of the command ({status}):\n{text}"

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        if llm is None:
            raise ValueError("llb-os needs an LLM")
        messages: list[dict[str, str]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.prompt(task, memories)},
        ]
        usage = Usage()
        lines = [f"Task: {task.intent}"]
        rounds = 0
        with self.sandbox() as box:
            init = self.initialize(box, task)
            if init is not None and (init.exit_code != 0 or init.timed_out):
                lines.append(f"(initialization exit code {init.exit_code})")
            ended = "rounds exhausted"
            while rounds < self.max_rounds:
                rounds += 1
                try:
                    reply = llm.chat(messages, json_schema=ACTION_SCHEMA, max_tokens=self.max_tokens)
                except LLMFormatError as exc:
                    ended = f"invalid answer: {exc}"
                    break
                usage = usage + reply.usage
                action = reply.data
                messages.append({"role": "assistant", "content": json.dumps(action)})
                thought = str(action.get("thought", "")).strip()
                content = str(action.get("content", ""))
                if action["action"] != "bash":
                    lines.append(f"Round {rounds}: {action['action']}: {content[:500]}" + _thought(thought))
                    ended = action["action"]
                    break
                result = box.run(content)
                shown = self._shown(result)
                lines.append(f"Round {rounds}: bash: {content[:1000]}" + _thought(thought) + "\n" + shown)
                messages.append({"role": "user", "content": shown})
            verdict = self.evaluate(box, task)
        success = verdict.exit_code == 0 and not verdict.timed_out
        lines.append(f"Ended: {ended}. Evaluation script: {'success' if success else 'failure'}.")
        return Episode(
            success=success,
            reward=self.reward_success if success else self.reward_failure,
            steps=rounds,
            trajectory="\n".join(lines),
            usage=usage,
        )


def _thought(thought: str) -> str:
    return f" (thought: {thought[:300]})" if thought else ""
