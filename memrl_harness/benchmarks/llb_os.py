"""LifelongAgentBench OS interaction: bash tasks in a throwaway Linux system, judged by a script.

Data: ``$MEMRL_SHARED_DATA/llb/os_interaction_train.json`` (350 tasks; ``data`` option), a dict
id -> ``instruction``, ``initialization_command_item``, ``evaluation_info`` (the
``evaluation_command_item`` and ``ground_truth_command_item`` bash scripts) and ``skill_list``.
``Task.intent`` is the instruction; ``Task.type`` the first skill.

Sandbox (one per episode): ``backend=bwrap`` (default) is :class:`memrl_harness.backends.bwrap.BwrapSandbox`, a
Debian bookworm system in bubblewrap whose root is an unprivileged host identity, with memory, process and disk
limits, a seccomp filter and no network (see that module for what it guarantees and what it does not);
``backend=docker`` is :class:`memrl_harness.backends.docker.DockerSandbox`, a container of a locally built ``image``
(``make docker``). Both share the :class:`memrl_harness.backends.sandbox.Sandbox` protocol.

Episode (LLB's loop): up to ``max_rounds`` (10) rounds; each round the LLM answers JSON
``{thought, action: bash|answer|finish, content}``; a ``bash`` command runs in the sandbox and
its output (cut to ``output_chars``) is the next user message; ``answer`` / ``finish`` end the
episode. In the step-memory modes each round's request also carries the step memory's advice on the current
observation (the last command's output; ``START`` before the first). Then the evaluation script runs in the same
sandbox through :meth:`Sandbox.check`, with a shell and tools the
agent cannot have replaced (replacing ``/bin/bash`` with ``exit 0`` does not pass a task): exit status 0 is
success (reward ``reward_success``, 1), anything else failure (``reward_failure``, 0; configs/llb.yaml). A
sandbox that dies under the agent (its holder gone) is a failure too.

Measured here (all 350 tasks, each in a fresh bwrap sandbox, the evaluation through ``check``, 8 workers on 2
cores shared with other jobs, 54-96 s for both passes): init -> ground truth -> evaluation passes 350/350;
init -> evaluation (no ground truth) passes 0/350. A sandbox starts, runs a command and is torn down in about
0.18 s.

Options: ``backend``, ``image``, ``data``, ``rootfs``, ``ids``, ``limit``, ``max_rounds``, ``command_timeout`` (20 s),
``memory_mb`` (1024), ``pids`` (256), ``disk_mb`` (512; bwrap only),
``eval_timeout`` (60 s), ``output_chars`` (800), ``max_tokens`` (512), ``reward_success``,
``reward_failure``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl_harness.backends.bwrap import BwrapSandbox, check_prerequisites
from memrl_harness.backends.cgroups import Limits
from memrl_harness.backends.docker import OS_IMAGE, DockerSandbox
from memrl_harness.backends.sandbox import CommandResult, Sandbox, SandboxError
from memrl_harness.benchmarks.base import (
    Episode,
    Memory,
    Steps,
    StepwiseBenchmark,
    Task,
    memory_sections,
    with_advice,
)
from memrl_harness.install import data_hint, default_rootfs, shared_data_root
from memrl_harness.llm import LLM, LLMFormatError, Usage

DATA_FILE = "llb/os_interaction_train.json"
START = "No command has run yet."  # the observation of the first round, for the step memory


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


class LLBOSBenchmark(StepwiseBenchmark):
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
        memory_mb: int | str = 1024,
        pids: int | str = 256,
        disk_mb: int | str = 512,
    ) -> None:
        data_file = Path(data) if data else shared_data_root() / DATA_FILE
        if not data_file.is_file():
            raise ValueError(data_hint("LLB OS data", data_file))
        if backend not in ("bwrap", "docker"):
            raise ValueError(f"backend: bwrap or docker, not {backend!r}")
        self.backend = backend
        self.rootfs = Path(rootfs) if rootfs else default_rootfs()
        self.image = image or OS_IMAGE
        self.limits = Limits(memory_mb=int(memory_mb), pids=int(pids), disk_mb=int(disk_mb))
        if backend == "bwrap":
            check_prerequisites(self.rootfs)
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
            return DockerSandbox(image=self.image, command_timeout=self.command_timeout)
        return BwrapSandbox(self.rootfs, self.command_timeout, self.limits)

    def initialize(self, box: Sandbox, task: Task) -> CommandResult | None:
        init = self.script(task, "init")
        return box.run(init, timeout=self.eval_timeout) if init.strip() else None

    def evaluate(self, box: Sandbox, task: Task) -> CommandResult:
        """The task's evaluation script, run as a checker (tools the agent cannot have replaced)."""
        return box.check(self.script(task, "evaluation"), timeout=self.eval_timeout)

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

    def _play(
        self, box: Sandbox, task: Task, llm: LLM, messages: list[dict[str, str]], lines: list[str], steps: Steps
    ) -> tuple[int, str, Usage]:
        """Initialization then up to ``max_rounds`` of the LLM's actions; rounds played, how it ended, usage."""
        init = self.initialize(box, task)
        if init is not None and (init.exit_code != 0 or init.timed_out):
            lines.append(f"(initialization exit code {init.exit_code})")
        ended, rounds, usage, observation = "rounds exhausted", 0, Usage(), START
        while rounds < self.max_rounds:
            rounds += 1
            chat = with_advice(messages, steps.advise(observation))
            try:
                reply = llm.chat(chat, json_schema=ACTION_SCHEMA, max_tokens=self.max_tokens)
            except LLMFormatError as exc:
                ended = f"invalid answer: {exc}"
                break
            usage = usage + reply.usage
            action = reply.data
            messages.append({"role": "assistant", "content": json.dumps(action)})
            thought = str(action.get("thought", "")).strip()
            content = str(action.get("content", ""))
            steps.took(observation, f"{action['action']}: {content}")
            if action["action"] != "bash":
                lines.append(f"Round {rounds}: {action['action']}: {content[:500]}" + _thought(thought))
                ended = action["action"]
                break
            result = box.run(content)
            observation = self._shown(result)
            lines.append(f"Round {rounds}: bash: {content[:1000]}" + _thought(thought) + "\n" + observation)
            messages.append({"role": "user", "content": observation})
        return rounds, ended, usage

    def run_steps(
        self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random, steps: Steps
    ) -> Episode:
        if llm is None:
            raise ValueError("llb-os needs an LLM")
        messages: list[dict[str, str]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.prompt(task, memories)},
        ]
        lines = [f"Task: {task.intent}"]
        rounds, usage = 0, Usage()
        with self.sandbox() as box:
            try:
                rounds, ended, usage = self._play(box, task, llm, messages, lines, steps)
                verdict = self.evaluate(box, task)
            except SandboxError as exc:  # the agent broke its own system (e.g. its holder ran out of memory)
                ended, verdict = f"sandbox died: {exc}"[:500], CommandResult(-1, "", False)
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
