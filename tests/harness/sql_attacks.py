"""Playing SQL attacks through the real runner against the llb-db benchmark (local MariaDB or Docker)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from memrl_harness.benchmarks.llb_db import LLBDBBenchmark
from memrl_harness.llm import LLM
from memrl_harness.results import EpisodeRecord, RunConfig, RunDir
from memrl_harness.runner import Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest

TASK, OTHER = "351", "254"  # an INSERT task (md5: doing nothing fails it) and a SELECT task


Action = str | Callable[[], str]  # the SQL, or a function that makes it when the model "writes" it


@dataclass
class Played:
    """What attack episodes gave: the harness's records and the output the model was shown of each action."""

    records: list[EpisodeRecord]
    outputs: dict[str, list[str]]  # by task id


async def play(
    fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path, actions: dict[str, Sequence[Action]]
) -> Played:
    """Episodes of the first tasks of ``bench`` (those in ``actions``, at once), in each of which the model runs
    its task's actions one per round, then answers. A long LLM timeout: an action may wait for the other episode."""
    gold = {t.intent: t.id for t in bench.tasks()}
    assert [t.id for t in bench.tasks()][: len(actions)] == list(actions)
    bench.options = bench.options.model_copy(update={"max_rounds": max(len(a) for a in actions.values()) + 1})

    def answer(request: RecordedRequest) -> str:
        task = next(i for intent, i in gold.items() if f"Task: {intent}" in request.messages[1]["content"])
        played = sum(m["role"] == "assistant" for m in request.messages)
        if played < len(actions[task]):
            action = actions[task][played]
            sql = action if isinstance(action, str) else action()
            return json.dumps({"thought": "attack", "action": "sql", "content": sql})
        return json.dumps({"thought": "done", "action": "answer", "content": "done"})

    fake_llm.responder = answer
    llm = LLM(fake_llm.base_url, fake_llm.model, "test-key", seed=7, timeout=120.0, backoff_base=0.01)
    config = RunConfig(benchmark="llb-db", mode="none", epochs=1, tasks=len(actions), seed=0, workers=len(actions))
    try:
        with anyio.fail_after(300):
            records = await Runner(config, bench, RunDir(tmp_path / f"run-{uuid.uuid4().hex[:6]}"), llm).run()
    finally:
        llm.close()
    outputs: dict[str, list[str]] = {}
    for request in fake_llm.chat_requests:
        task = next(i for intent, i in gold.items() if f"Task: {intent}" in request.messages[1]["content"])
        shown = [m["content"] for m in request.messages[2:] if m["role"] == "user"]
        if len(shown) > len(outputs.get(task, [])):
            outputs[task] = shown
    assert len(records) == len(actions), records
    assert {t: len(o) for t, o in outputs.items()} == {t: len(a) for t, a in actions.items()}, outputs
    return Played(records, outputs)


def refused(output: str) -> bool:
    return output.startswith("Error: ERROR ")
