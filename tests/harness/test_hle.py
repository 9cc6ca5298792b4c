"""HLE: hand-written rows in HLE's format, a scripted agent and a scripted judge (the fake LLM)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import anyio
import pytest

from memrl_harness.benchmarks import load_benchmark
from memrl_harness.benchmarks.base import Memory
from memrl_harness.benchmarks.hle import (
    ENV_JUDGE_BASE_URL,
    ENV_JUDGE_MODEL,
    SYSTEM_EXACT_ANSWER,
    SYSTEM_MC,
    HLEBenchmark,
    exact_match,
    extract_answer,
)
from memrl_harness.llm import LLM
from memrl_harness.results import RunConfig, RunDir
from memrl_harness.runner import Runner
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.harness.hle_rows import ROWS


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "hle.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


@pytest.fixture(autouse=True)
def no_judge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_JUDGE_BASE_URL, raising=False)
    monkeypatch.delenv(ENV_JUDGE_MODEL, raising=False)


def response(answer: str, label: str = "Exact Answer") -> str:
    return f"Explanation: I thought about it.\n{label}: {answer}\nConfidence: 80%"


def verdict(correct: str, extracted: str = "101") -> str:
    return json.dumps(
        {"extracted_final_answer": extracted, "reasoning": "compared", "correct": correct, "confidence": 80}
    )


def test_tasks_from_a_jsonl_file(data: Path) -> None:
    bench = load_benchmark("hle", data=str(data))
    assert [(t.id, t.type) for t in bench.tasks()] == [
        ("q-math", "Math"),
        ("q-chem", "Chemistry"),
        ("q-image", "Other"),
    ]
    assert bench.tasks()[0].intent == ROWS[0]["question"]
    assert [t.id for t in HLEBenchmark(data=str(data), text_only="true").tasks()] == ["q-math", "q-chem"]
    assert [t.id for t in HLEBenchmark(data=str(data), category="Math").tasks()] == ["q-math"]
    with pytest.raises(ValueError, match="data=PATH"):
        HLEBenchmark()
    with pytest.raises(ValueError, match="both judge_base_url and judge_model"):
        HLEBenchmark(data=str(data), judge_model="judge")


def test_answer_extraction_and_exact_match() -> None:
    assert extract_answer(response("101")) == "101"
    assert extract_answer("Explanation: x\n**Answer:** B. Nitrogen\nConfidence: 9%") == "B. Nitrogen"
    assert extract_answer("no format at all\n42") == "42"
    assert exact_match("$101$.", "101", "exactMatch")
    assert exact_match("1.0e2", "100", "exactMatch")
    assert exact_match("B. Nitrogen", "B", "multipleChoice")
    assert exact_match("(b)", "B", "multipleChoice")
    assert not exact_match("A", "B", "multipleChoice")
    assert exact_match("  The  Cat ", "the cat", "exactMatch")
    assert not exact_match("102", "101", "exactMatch")


def test_the_prompt_follows_hle_and_carries_memories(data: Path, fake_llm: FakeLLMServer, llm: LLM) -> None:
    bench = HLEBenchmark(data=str(data), judge="exact")
    math, chem, _ = bench.tasks()
    memories = [
        Memory("m1", "a prime question", "list the candidates and test divisibility", "success", 0.5, 0.8),
        Memory("m2", "another prime", "answered 100, which is not prime", "failure", -0.3, 0.7),
    ]
    fake_llm.script(response("101"), response("B", "Answer"))
    first = bench.run_episode(math, memories, llm, random.Random(0))
    second = bench.run_episode(chem, [], llm, random.Random(0))
    assert first.success and first.reward == 1.0 and second.success
    sent = fake_llm.chat_requests
    assert sent[0].messages[0] == {"role": "system", "content": SYSTEM_EXACT_ANSWER}
    assert sent[1].messages[0] == {"role": "system", "content": SYSTEM_MC}
    assert "test divisibility" in sent[0].last_user and "answered 100" in sent[0].last_user
    assert sent[0].last_user.index("Experiences that worked") < sent[0].last_user.index("Mistakes made")
    assert sent[1].last_user == chem.data["question"]
    assert "101" not in first.trajectory.split("Response:")[0]  # the gold is never in the trajectory's prefix
    assert "Verdict (exact): correct" in first.trajectory


def test_the_judge_decides(data: Path, fake_llm: FakeLLMServer, llm: LLM) -> None:
    bench = HLEBenchmark(data=str(data), judge_base_url=fake_llm.base_url, judge_model="judge-model")
    bench.judge = LLM(fake_llm.base_url, "judge-model", "k", backoff_base=0.01, backoff_max=0.05, timeout=2.0)
    math = bench.tasks()[0]
    # The judge overrules exact match both ways: "one hundred and one" is right, "101" wrongly formatted here is not.
    fake_llm.script(response("one hundred and one"), verdict("yes", "one hundred and one"))
    good = bench.run_episode(math, [], llm, random.Random(0))
    fake_llm.script(response("101"), verdict("No"))
    bad = bench.run_episode(math, [], llm, random.Random(0))
    assert good.success and good.reward == 1.0 and "Verdict (judge): correct" in good.trajectory
    assert not bad.success and bad.reward == -1.0
    judge_request = fake_llm.chat_requests[1]
    assert judge_request.model == "judge-model"
    assert judge_request.response_format is not None and judge_request.response_format["type"] == "json_schema"
    assert "[correct_answer]: 101" in judge_request.last_user
    assert good.usage.calls == 2  # the agent's answer and the verdict


def test_a_malformed_or_unclear_verdict_falls_back_to_exact_match(
    data: Path, fake_llm: FakeLLMServer, llm: LLM
) -> None:
    bench = HLEBenchmark(data=str(data), judge_base_url=fake_llm.base_url, judge_model="judge-model")
    math = bench.tasks()[0]
    fake_llm.script(response("101"), "correct: yes (but not JSON)", '{"correct": "yes"}')  # twice malformed
    first = bench.run_episode(math, [], llm, random.Random(0))
    assert first.success and "exact (judge reply malformed" in first.trajectory
    fake_llm.script(response("99"), verdict("maybe"))
    second = bench.run_episode(math, [], llm, random.Random(0))
    assert not second.success and "judge said correct='maybe'" in second.trajectory
    assert fake_llm.pending == 0


def test_the_judge_comes_from_the_environment(
    data: Path, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_JUDGE_BASE_URL, fake_llm.base_url)
    monkeypatch.setenv(ENV_JUDGE_MODEL, "env-judge")
    bench = HLEBenchmark(data=str(data))
    assert bench.judge is not None and bench.judge.model == "env-judge"
    assert HLEBenchmark(data=str(data), judge="exact").judge is None


@pytest.mark.slow  # a run through a memrl-mcp server
@pytest.mark.anyio
async def test_a_memrl_run(data: Path, fake_llm: FakeLLMServer, llm: LLM, tmp_path: Path) -> None:
    bench = HLEBenchmark(data=str(data), judge="exact", text_only=True)

    def answer(request: RecordedRequest) -> str:
        text = request.last_user
        if "smallest prime" in text and request.messages[0]["content"] == SYSTEM_EXACT_ANSWER:
            return response("101")
        if "abundant" in text and request.messages[0]["content"] == SYSTEM_MC:
            return response("A", "Answer")  # always wrong
        if text.rstrip().endswith("Steps:"):
            return "1. recall the definition 2. check candidates"
        return "Oxygen is not the most abundant gas; recall the composition of air."

    fake_llm.responder = answer
    config = RunConfig(benchmark="hle", mode="memrl", epochs=2, seed=0)
    with anyio.fail_after(90):
        records = await Runner(config, bench, RunDir(tmp_path / "run"), llm).run()
    assert sorted((r.epoch, r.task_id, r.success, r.task_type) for r in records) == [
        (1, "q-chem", False, "Chemistry"),
        (1, "q-math", True, "Math"),
        (2, "q-chem", False, "Chemistry"),
        (2, "q-math", True, "Math"),
    ]
