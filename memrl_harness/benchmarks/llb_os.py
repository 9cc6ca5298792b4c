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
its output (cut to ``max_output_chars``) is the next user message; ``answer`` / ``finish`` end the
episode. In the step-memory modes each round's request also carries the step memory's advice on the current
observation (the last command's output; ``START`` before the first). Then the evaluation script runs in the same
sandbox through :meth:`Sandbox.check`, with a shell and tools the
agent cannot have replaced (replacing ``/bin/bash`` with ``exit 0`` does not pass a task): exit status 0 is
success (reward ``reward_success``, 1), anything else failure (``reward_failure``, 0; configs/llb.yaml). A
sandbox that dies under the agent (its holder gone) is a failure too.

How the check was validated (the ground truth passes every task, doing nothing none) and what a sandbox costs:
docs/harness.md and docs/performance.md.

Options (``--option KEY=VALUE``): :class:`LLBOSOptions` (``memrl-harness options llb-os``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl_harness.backends.bwrap import BwrapSandbox, check_prerequisites
from memrl_harness.backends.cgroups import FLOORS, Limits
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
from memrl_harness.benchmarks.options import LLBOptions
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


class LLBOSOptions(LLBOptions):
    """LLB OS's options; the module docstring says what the sandbox backends are."""

    backend: Literal["bwrap", "docker"] = Field(
        "bwrap", description="the sandbox: bubblewrap over rootfs, or a container of image"
    )
    rootfs: Path | None = Field(None, description="backend=bwrap: the root filesystem (default: make sandbox's)")
    command_timeout: float = Field(20.0, gt=0, description="seconds one command may run")
    eval_timeout: float = Field(60.0, gt=0, description="seconds the initialisation or the evaluation may run")
    reward_success: float = Field(1.0, description="the reward of a passed evaluation")
    reward_failure: float = Field(0.0, description="the reward of a failed one")
    memory_mb: int = Field(1024, ge=FLOORS["memory_mb"], description="memory of a sandbox, all its processes together")
    pids: int = Field(256, ge=FLOORS["pids"], description="processes and threads of a sandbox")
    disk_mb: int = Field(512, ge=FLOORS["disk_mb"], description="backend=bwrap: the size of its writable layer")


class LLBOSBenchmark(StepwiseBenchmark):
    """LifelongAgentBench OS interaction tasks, each in its own :class:`Sandbox`."""

    name = "llb-os"
    needs_llm = True
    Options = LLBOSOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`LLBOSOptions`, as text (``--option limit=20``) or typed."""
        options = self.options = LLBOSOptions.parse(self.name, values)
        data_file = options.data or shared_data_root() / DATA_FILE
        if not data_file.is_file():
            raise ValueError(data_hint("LLB OS data", data_file))
        self.rootfs = options.rootfs or default_rootfs()
        self.limits = Limits(memory_mb=options.memory_mb, pids=options.pids, disk_mb=options.disk_mb)
        if options.backend == "bwrap":
            check_prerequisites(self.rootfs)
        rows: dict[str, dict[str, Any]] = json.loads(data_file.read_text())
        order = sorted(rows, key=lambda k: (int(k), k) if k.isdigit() else (1 << 62, k))
        if options.ids is not None:
            unknown = [i for i in options.ids if i not in rows]
            if unknown:
                raise ValueError(f"ids: not in the data: {', '.join(unknown)}")
            order = list(options.ids)
        self._tasks = [self._task(i, rows[i]) for i in order[: options.limit]]

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
        if self.options.backend == "docker":
            return DockerSandbox(image=self.options.image or OS_IMAGE, command_timeout=self.options.command_timeout)
        return BwrapSandbox(self.rootfs, self.options.command_timeout, self.limits)

    def initialize(self, box: Sandbox, task: Task) -> CommandResult | None:
        init = self.script(task, "init")
        return box.run(init, timeout=self.options.eval_timeout) if init.strip() else None

    def evaluate(self, box: Sandbox, task: Task) -> CommandResult:
        """The task's evaluation script, run as a checker (tools the agent cannot have replaced)."""
        return box.check(self.script(task, "evaluation"), timeout=self.options.eval_timeout)

    def prompt(self, task: Task, memories: Sequence[Memory]) -> str:
        parts = memory_sections(memories)
        parts.append(f"Task: {task.intent}")
        parts.append(f"You have at most {self.options.max_rounds} rounds. Answer with the JSON object only.")
        return "\n\n".join(parts)

    def _shown(self, result: CommandResult) -> str:
        text = result.output
        if len(text) > self.options.max_output_chars:
            text = text[: self.options.max_output_chars] + f"\n[truncated: {len(result.output)} characters in all]"
        timeout = self.options.command_timeout
        status = f"timed out after {timeout:g} s" if result.timed_out else f"exit code {result.exit_code}"
        return f"The output of the command ({status}):\n{text}"

    def _play(
        self, box: Sandbox, task: Task, llm: LLM, messages: list[dict[str, str]], lines: list[str], steps: Steps
    ) -> tuple[int, str, Usage]:
        """Initialization then up to ``max_rounds`` of the LLM's actions; rounds played, how it ended, usage."""
        init = self.initialize(box, task)
        if init is not None and (init.exit_code != 0 or init.timed_out):
            lines.append(f"(initialization exit code {init.exit_code})")
        ended, rounds, usage, observation = "rounds exhausted", 0, Usage(), START
        while rounds < self.options.max_rounds:
            rounds += 1
            chat = with_advice(messages, steps.advise(observation))
            try:
                reply = llm.chat(chat, json_schema=ACTION_SCHEMA, max_tokens=self.options.max_tokens)
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
            reward=self.options.reward_success if success else self.options.reward_failure,
            steps=rounds,
            trajectory="\n".join(lines),
            usage=usage,
        )


def _thought(thought: str) -> str:
    return f" (thought: {thought[:300]})" if thought else ""
