"""The local default LLM end to end: llama.cpp's real server, SmolLM2, the harness's client.

No skip when llama-cpp-python or the model is missing: ``make llm`` installs them for
``make test``, and a silently skipped test would hide a broken install.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks.controlled import ControlledBenchmark
from memrl_harness.llm import LLM, LLMError, is_context_overflow
from memrl_harness.local_llm import LocalLLMError, LocalServer, check_installed, local_llm_server
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import Runner

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
