"""The LLM client over real HTTP against the scripted fake: retries, errors, usage, JSON, prompts."""

from __future__ import annotations

import itertools
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from memrl_harness.llm import (
    LLM,
    SUMMARY_MAX_TOKENS,
    LLMError,
    LLMFormatError,
    LLMSettings,
    Usage,
    is_context_overflow,
    summarize_experience,
    truncate_middle,
)
from tests.harness.fake_llm import FakeLLMServer, FakeReply, RecordedRequest

SCHEMA = {
    "title": "Action",
    "type": "object",
    "properties": {"action": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["action", "confidence"],
    "additionalProperties": False,
}


def recording_llm(fake: FakeLLMServer, delays: list[float], **kwargs: Any) -> LLM:
    """An LLM whose backoff sleeps are recorded instead of slept."""
    options: dict[str, Any] = {"timeout": 2.0, "backoff_base": 1.0, "backoff_max": 8.0, "sleep": delays.append}
    options.update(kwargs)
    return LLM(fake.base_url, fake.model, "k", **options)


def test_chat_sends_settings_and_returns_text_and_usage(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script(FakeReply("  hi there  ", prompt_tokens=11, completion_tokens=3))
    reply = llm.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    assert reply.text == "  hi there  "
    assert reply.usage == Usage(11, 3, 1)
    assert reply.data is None and reply.finish_reason == "stop"
    (request,) = fake_llm.chat_requests
    assert request.model == "fake-model" and request.temperature == 0.0 and request.seed == 7
    assert request.max_tokens == 512 and request.response_format is None
    assert request.messages[-1] == {"role": "user", "content": "hello"}
    assert request.headers["authorization"] == "Bearer test-key"


def test_retries_503_with_growing_backoff_then_succeeds(fake_llm: FakeLLMServer) -> None:
    delays: list[float] = []
    fake_llm.fail(3, status=503)
    fake_llm.script("ok")
    reply = recording_llm(fake_llm, delays).chat([{"role": "user", "content": "x"}])
    assert reply.text == "ok" and reply.usage.calls == 1
    assert len(fake_llm.chat_requests) == 4
    # full jitter in [d/2, d] around 1, 2, 4 seconds
    assert [0.5 <= delays[0] <= 1, 1 <= delays[1] <= 2, 2 <= delays[2] <= 4] == [True] * 3


def test_429_is_retried_and_retry_after_is_honoured(fake_llm: FakeLLMServer) -> None:
    delays: list[float] = []
    fake_llm.fail(1, status=429, retry_after=5)
    fake_llm.fail(1, status=429, retry_after=100)
    fake_llm.script("ok")
    assert recording_llm(fake_llm, delays).chat([{"role": "user", "content": "x"}]).text == "ok"
    assert delays[0] == 5  # the server's wish beats the 0.5-1 s backoff
    assert delays[1] == 8  # ... but never beyond backoff_max


def test_retries_really_wait_and_then_succeed(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.fail(2, status=429)
    fake_llm.fail(1, status=500)
    fake_llm.script("done")
    assert llm.chat([{"role": "user", "content": "x"}]).text == "done"
    times = [r.at for r in fake_llm.chat_requests]
    assert len(times) == 4 and all(b - a >= 0.005 for a, b in itertools.pairwise(times))


def test_400_fails_at_once_with_the_servers_message(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.fail(1, status=400, message="context length exceeded")
    fake_llm.script("never sent")
    with pytest.raises(LLMError, match=r"HTTP 400, not retried\): context length exceeded"):
        llm.chat([{"role": "user", "content": "x"}])
    assert len(fake_llm.chat_requests) == 1 and fake_llm.pending == 1


def test_gives_up_after_max_retries(fake_llm: FakeLLMServer) -> None:
    delays: list[float] = []
    fake_llm.fail(10, status=503, message="overloaded")
    with pytest.raises(LLMError, match="still failing after 3 tries: HTTP 503: overloaded"):
        recording_llm(fake_llm, delays, max_retries=2).chat([{"role": "user", "content": "x"}])
    assert len(fake_llm.chat_requests) == 3 and len(delays) == 2


def test_timeouts_are_retried_then_reported(fake_llm: FakeLLMServer) -> None:
    llm = LLM(fake_llm.base_url, "m", timeout=0.3, max_retries=1, backoff_base=0.01)
    fake_llm.hang(1, seconds=5)
    fake_llm.script("in time")
    assert llm.chat([{"role": "user", "content": "x"}]).text == "in time"

    fake_llm.hang(2, seconds=5)
    start = time.monotonic()
    with pytest.raises(LLMError, match=r"unreachable after 2 tries: timed out \(timeout=0.3s\)"):
        llm.chat([{"role": "user", "content": "x"}])
    assert time.monotonic() - start < 3
    assert len(fake_llm.chat_requests) == 4


def test_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    delays: list[float] = []
    llm = LLM(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, sleep=delays.append)
    with pytest.raises(LLMError, match="unreachable after 3 tries"):
        llm.chat([{"role": "user", "content": "x"}])
    assert len(delays) == 2 and llm.usage == Usage()


def test_usage_is_summed_over_calls_and_threads(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.responder = lambda request: "two words"
    messages = [{"role": "user", "content": "three word prompt"}]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: llm.chat(messages), range(40)))
    total = sum((r.usage for r in replies), Usage())
    assert total == Usage(prompt_tokens=120, completion_tokens=80, calls=40)
    assert llm.usage == total and llm.usage.total == 200


def test_usage_arithmetic() -> None:
    assert Usage(1, 2, 1) + Usage(10, 20, 2) == Usage(11, 22, 3)
    assert Usage(1, 2).total == 3 and Usage().calls == 0


def test_json_schema_request_shape_and_parsing(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script('{"action": "open door", "confidence": 0.9}')
    reply = llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA, max_tokens=64)
    assert reply.data == {"action": "open door", "confidence": 0.9}
    (request,) = fake_llm.chat_requests
    assert request.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "Action", "schema": SCHEMA, "strict": True},
    }
    assert request.max_tokens == 64


LLAMA_CPP_PYTHON_REJECTION = (
    "1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}"
)


def llama_cpp_python_like(request: RecordedRequest) -> str | FakeReply:
    """Answers as llama-cpp-python's server does: json_schema is a 500, json_object + schema works."""
    if request.response_format and request.response_format["type"] == "json_schema":
        return FakeReply(status=500, content=LLAMA_CPP_PYTHON_REJECTION)
    return '{"action": "go", "confidence": 0.5}'


def test_auto_falls_back_to_json_object_and_remembers(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.responder = llama_cpp_python_like
    first = llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA)
    second = llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA)
    assert first.data == second.data == {"action": "go", "confidence": 0.5}
    formats = [r.response_format for r in fake_llm.chat_requests]
    types = [f["type"] if f else None for f in formats]
    assert types == ["json_schema", "json_object", "json_object"]  # no retries of the 500
    assert formats[1] == {"type": "json_object", "schema": SCHEMA}
    assert llm.structured_output == "json_object"


def test_an_unrelated_400_does_not_switch_the_format(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.fail(1, status=400, message="This model's maximum context length is 2048 tokens")
    with pytest.raises(LLMError, match="HTTP 400, not retried"):
        llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA)
    assert llm.structured_output == "auto" and len(fake_llm.chat_requests) == 1


def test_json_object_mode_can_be_chosen(fake_llm: FakeLLMServer) -> None:
    llm = LLM(fake_llm.base_url, "m", structured_output="json_object")
    fake_llm.script('{"action": "a", "confidence": 1}')
    assert llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA).data["action"] == "a"
    assert fake_llm.chat_requests[0].response_format == {"type": "json_object", "schema": SCHEMA}


def test_json_in_a_code_fence_is_accepted(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script('Sure:\n```json\n{"action": "look", "confidence": 1}\n```')
    assert llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA).data == {
        "action": "look",
        "confidence": 1,
    }


def test_invalid_json_is_asked_again_once(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script(FakeReply("{not json", completion_tokens=5), FakeReply('{"action": "a", "confidence": 0}'))
    reply = llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA)
    assert reply.data == {"action": "a", "confidence": 0}
    assert reply.usage.calls == 2 and reply.usage.completion_tokens == 5 + 4
    assert llm.usage == reply.usage


def test_invalid_json_twice_raises_a_clear_error(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script('{"action": 3, "confidence": 0}', FakeReply('{"action": "a", "conf', finish_reason="length"))
    with pytest.raises(LLMFormatError, match=r"no valid JSON for the schema twice: not JSON.*cut at max_tokens=512"):
        llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA)
    assert llm.usage.calls == 2


def test_schema_mismatch_is_named(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script(*['{"action": "a"}'] * 2)
    with pytest.raises(LLMFormatError, match="'confidence' is a required property"):
        llm.chat([{"role": "user", "content": "act"}], json_schema=SCHEMA)


def test_summarize_success_asks_for_a_short_procedure(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script(" 1. Find the mug.\n2. Heat it.\n3. Put it on the table. \n")
    text, usage = summarize_experience(llm, "heat a mug", "> go to cabinet\nmug found\n> heat mug", True)
    assert text == "1. Find the mug.\n2. Heat it.\n3. Put it on the table."
    assert usage.calls == 1 and usage.completion_tokens == 13
    (request,) = fake_llm.chat_requests
    prompt = request.last_user
    assert "SUCCEEDED" in prompt and "3 to 5 numbered" in prompt and "Plain text" in prompt
    assert "heat a mug" in prompt and "> heat mug" in prompt and prompt.endswith("Steps:")
    assert request.max_tokens == SUMMARY_MAX_TOKENS and request.response_format is None


def test_summarize_failure_asks_for_a_reflection(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.script("I heated the wrong object. Check the object before acting.")
    text, _ = summarize_experience(llm, "heat a mug", "> heat cup\nnothing happens", False)
    assert text.startswith("I heated the wrong object")
    prompt = fake_llm.chat_requests[0].last_user
    assert "FAILED" in prompt and "reflection" in prompt and "avoid" in prompt and prompt.endswith("Reflection:")
    assert "SUCCEEDED" not in prompt


def test_summarize_keeps_start_and_end_of_a_long_trajectory(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.responder = lambda request: ""  # an empty answer still gives a usable memory
    steps = "\n".join(f"step {i}: did thing {i}" for i in range(5000))
    text, _ = summarize_experience(llm, "task", steps, False)
    prompt = fake_llm.chat_requests[0].last_user
    assert len(prompt) < 3200  # <= ~1400 tokens: fits a 2048-token context with the answer
    assert "step 0: did thing 0\n" in prompt and prompt.rstrip().endswith("step 4999: did thing 4999\n\nReflection:")
    assert "characters omitted" in prompt and "step 2500:" not in prompt
    assert text.startswith("Failed; last steps:") and text.endswith("step 4999: did thing 4999")


def test_summarize_halves_the_trajectory_until_it_fits(fake_llm: FakeLLMServer, llm: LLM) -> None:
    def small_context(request: RecordedRequest) -> str | FakeReply:
        if len(request.last_user) > 1000:
            return FakeReply(status=400, content="This model's maximum context length is 2048 tokens. However, ...")
        return "1. Do it."

    fake_llm.responder = small_context
    text, usage = summarize_experience(llm, "task " * 200, "日本語 " * 5000, True)
    assert text == "1. Do it." and usage.calls == 1
    sizes = [len(r.last_user) for r in fake_llm.chat_requests]
    assert len(sizes) == 3 and sizes[0] > sizes[1] > 1000 > sizes[2]


def test_other_errors_are_not_mistaken_for_a_long_prompt(fake_llm: FakeLLMServer, llm: LLM) -> None:
    fake_llm.fail(1, status=400, message="invalid model name")
    with pytest.raises(LLMError, match="invalid model name") as caught:
        summarize_experience(llm, "t", "x", True)
    assert caught.value.status == 400 and not is_context_overflow(caught.value)
    assert is_context_overflow(LLMError("the request exceeds the available context size", 400))
    assert not is_context_overflow(LLMError("maximum context length", 503))


def test_truncate_middle_cuts_on_lines() -> None:
    text = "\n".join(f"line {i:03d}" for i in range(200))
    cut = truncate_middle(text, 300)
    assert len(cut) <= 300 and cut.startswith("line 000\n") and cut.endswith("line 199")
    kept = [line for line in cut.splitlines() if line.startswith("line")]
    assert all(len(line) == 8 for line in kept)  # no half lines
    assert truncate_middle("short", 300) == "short"


def test_from_env_reads_the_memrl_variables(fake_llm: FakeLLMServer) -> None:
    env = {"MEMRL_LLM_BASE_URL": fake_llm.base_url, "MEMRL_LLM_MODEL": "env-model", "MEMRL_LLM_API_KEY": "sk-env"}
    llm = LLM.from_env(env, seed=3)
    fake_llm.script("ok")
    assert llm.chat([{"role": "user", "content": "x"}]).text == "ok"
    request = fake_llm.chat_requests[0]
    assert request.model == "env-model" and request.seed == 3
    assert request.headers["authorization"] == "Bearer sk-env"

    fallback = LLM.from_env({**env, "MEMRL_LLM_API_KEY": "", "OPENAI_API_KEY": "sk-openai"}, model="override")
    fake_llm.script("ok")
    fallback.chat([{"role": "user", "content": "x"}])
    assert fake_llm.chat_requests[1].headers["authorization"] == "Bearer sk-openai"
    assert fake_llm.chat_requests[1].model == "override"

    local = LLM.from_env({"MEMRL_LLM_BASE_URL": fake_llm.base_url, "MEMRL_LLM_MODEL": "m"})
    fake_llm.script("ok")
    local.chat([{"role": "user", "content": "x"}])
    assert fake_llm.chat_requests[2].headers["authorization"] == "Bearer unused"


def test_from_env_names_what_is_missing() -> None:
    with pytest.raises(LLMError, match="set MEMRL_LLM_BASE_URL and MEMRL_LLM_MODEL"):
        LLM.from_env({})
    with pytest.raises(LLMError, match=r"set MEMRL_LLM_MODEL \(or base_url and model in the llm: group"):
        LLM.from_env({"MEMRL_LLM_BASE_URL": "http://127.0.0.1:1/v1"})


def test_the_run_files_llm_group_fills_in_and_the_environment_wins() -> None:
    in_file = LLMSettings(base_url="http://127.0.0.1:1/v1", model="from-the-file")
    llm = LLM.from_env({}, in_file)
    assert (llm.base_url, llm.model) == ("http://127.0.0.1:1/v1", "from-the-file")
    llm.close()
    llm = LLM.from_env({"MEMRL_LLM_MODEL": "from-the-environment"}, in_file)
    assert (llm.base_url, llm.model) == ("http://127.0.0.1:1/v1", "from-the-environment")
    llm.close()


def test_fake_server_models_route_and_unscripted_requests(fake_llm: FakeLLMServer, llm: LLM) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{fake_llm.base_url}/models", timeout=2) as response:
        assert json.load(response)["data"][0]["id"] == "fake-model"
    with pytest.raises(LLMError, match="no scripted reply left for request #0"):
        llm.chat([{"role": "user", "content": "x"}])

    def broken(request: RecordedRequest) -> str:
        raise KeyError("oops")

    fake_llm.responder = broken
    with pytest.raises(LLMError, match="responder raised KeyError"):
        llm.chat([{"role": "user", "content": "x"}])
