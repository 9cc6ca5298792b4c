"""Playing shell attacks through the real runner against the llb-os benchmark (bubblewrap or Docker)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from memrl_harness.benchmarks.llb_os import LLBOSBenchmark
from memrl_harness.llm import LLM
from memrl_harness.results import EpisodeRecord, RunConfig, RunDir
from memrl_harness.runner import Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest

TASK = "0"  # its evaluation checks files in /var/log/app; doing nothing fails it


@dataclass
class Played:
    """What an attack episode gave: the harness's record and the output the model was shown of each command."""

    record: EpisodeRecord
    outputs: list[str]


async def play(fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path, commands: Sequence[str], **options) -> Played:
    """One llb-os episode in which the model runs ``commands`` one per round, then finishes."""
    bench = LLBOSBenchmark(ids=TASK, max_rounds=len(commands) + 1, **options)

    def answer(request: RecordedRequest) -> str:
        played = sum(m["role"] == "assistant" for m in request.messages)
        if played < len(commands):
            return json.dumps({"thought": "attack", "action": "bash", "content": commands[played]})
        return json.dumps({"thought": "done", "action": "finish", "content": ""})

    fake_llm.responder = answer
    config = RunConfig(benchmark="llb-os", mode="none", epochs=1, tasks=1, seed=0)
    with anyio.fail_after(300):
        records = await Runner(config, bench, RunDir(tmp_path / f"run-{uuid.uuid4().hex[:6]}"), llm).run()
    last = fake_llm.chat_requests[-1].messages
    outputs = [m["content"].split("\n", 1)[1] for m in last[2:] if m["role"] == "user"]  # after the status line
    assert len(records) == 1 and len(outputs) == len(commands), outputs
    return Played(records[0], outputs)


SYSCALLS = {"keyctl": 250, "bpf": 321, "perf_event_open": 298, "io_uring_setup": 425, "unshare": 272}
