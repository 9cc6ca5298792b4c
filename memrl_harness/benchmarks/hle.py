"""Humanity's Last Exam (HLE): hard questions with short gold answers, judged by an LLM.

HLE is gated by its authors and must not be redistributed, so it is never shipped: the user gives
the file (``--option data=PATH``), jsonl (always) or parquet (when pandas or pyarrow is installed),
with the columns ``id, question, answer, answer_type, category`` (as in ``cais/hle``; ``image`` and
the rest are ignored, so image questions are asked as text only; ``text_only=true`` drops rows
with a non-empty ``image``). ``limit`` keeps the first N rows, ``category`` one category.

Episode: one LLM call with the question under HLE's official system prompt for its
``answer_type`` (``exactMatch``: "Explanation / Exact Answer / Confidence"; ``multipleChoice``:
"Explanation / Answer / Confidence") and the recalled memories (successes to follow, failures to
avoid). Task type = ``category``; the memory key (intent) is the question cut to
``intent_chars`` (600) characters.

Judge (the reward, +1 correct / -1 not): a judge LLM with HLE's official judge prompt, asked for a
structured verdict (``extracted_final_answer, reasoning, correct: yes|no, confidence``). It is set
by the options ``judge_base_url`` / ``judge_model`` (``judge_api_key``), else the environment
``MEMRL_JUDGE_BASE_URL`` / ``MEMRL_JUDGE_MODEL`` (``MEMRL_JUDGE_API_KEY``): it may be another model
than the agent's. A verdict whose ``correct`` is not a clear yes/no, or a reply that is not the
JSON asked for (twice), falls back to exact match and says so in the trajectory. With no judge
configured (or ``judge=exact``) the checker is exact match: the answer after "Exact Answer:" /
"Answer:" against the gold, both normalised (case, spaces, surrounding ``$``, final period;
multiple choice by option letter; numbers within a relative 1e-6).

The trajectory the runner turns into an experience holds the question, the response, the extracted
answer and the verdict, never the gold answer or the judge's reasoning (which quotes it): a memory
must teach how to answer, not hand the next epoch the answer key.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl_harness.benchmarks.base import Episode, Memory, Task, memory_sections
from memrl_harness.benchmarks.options import BenchmarkOptions
from memrl_harness.llm import LLM, LLMFormatError, Usage

ENV_JUDGE_BASE_URL = "MEMRL_JUDGE_BASE_URL"
ENV_JUDGE_MODEL = "MEMRL_JUDGE_MODEL"
ENV_JUDGE_API_KEY = "MEMRL_JUDGE_API_KEY"

# HLE's official prompts (centerforaisafety/hle, hle_eval/run_model_predictions.py and run_judge_results.py).
SYSTEM_EXACT_ANSWER = (
    "Your response should be in the following format:\n"
    "Explanation: {your explanation for your final answer}\n"
    "Exact Answer: {your succinct, final answer}\n"
    "Confidence: {your confidence score between 0% and 100% for your answer}"
)
SYSTEM_MC = (
    "Your response should be in the following format:\n"
    "Explanation: {your explanation for your answer choice}\n"
    "Answer: {your chosen answer}\n"
    "Confidence: {your confidence score between 0% and 100% for your answer}"
)
JUDGE_PROMPT = """Judge whether the following [response] to [question] is correct or not based on the precise and \
unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if \
there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only on \
if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on any \
background to the problem, do not attempt to solve the problem, do not argue for any answer different than \
[correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin \
of error for numerical problems. Answer 'no' otherwise, i.e. if there if there are any inconsistencies, ambiguity, \
non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0% and 100% from [response]. Put 100 if there is no confidence \
score available."""

# Loose on purpose (the official one has correct: Literal["yes", "no"], confidence: int): a judge
# answering "Yes" or "85%" should not cost a retry; the values are normalised below.
JUDGE_SCHEMA: Mapping[str, Any] = {
    "title": "hle_judgement",
    "type": "object",
    "properties": {
        "extracted_final_answer": {"type": "string"},
        "reasoning": {"type": "string"},
        "correct": {"type": "string"},
        "confidence": {"type": ["number", "string"]},
    },
    "required": ["extracted_final_answer", "reasoning", "correct", "confidence"],
    "additionalProperties": False,
}

_ANSWER = re.compile(r"^\s*\**\s*(?:exact\s+answer|final\s+answer|answer)\s*\**\s*:\s*\**\s*(.+?)\s*$", re.I | re.M)
_LETTER = re.compile(r"^\(?([A-Za-z])\)?(?:[.):\s]|$)")


@dataclass(frozen=True)
class Verdict:
    """The checker's word: correct or not, by whom (``judge`` / ``exact`` / ``exact (why)``)."""

    correct: bool
    by: str
    extracted: str
    reasoning: str = ""
    confidence: float | None = None


def extract_answer(response: str) -> str:
    """The answer a response gives after "Exact Answer:" / "Answer:" (the last one); else its last line."""
    found = _ANSWER.findall(response)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", str(text)).strip()
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    previous = None
    while previous != text:  # peel "**$101$.**" in any order
        previous = text
        text = text.strip().strip("*").rstrip(".").strip().strip("$").strip()
    return re.sub(r"\s+", " ", text).lower()


def exact_match(extracted: str, gold: str, answer_type: str) -> bool:
    """Normalised equality; multiple choice compares the option letter; numbers within rel. 1e-6."""
    got, want = normalise(extracted), normalise(gold)
    if answer_type == "multipleChoice":
        got_letter, want_letter = _LETTER.match(got), _LETTER.match(want)
        if got_letter and want_letter and len(want) <= 3:
            return got_letter.group(1) == want_letter.group(1)
    if got == want:
        return True
    try:
        a, b = float(got.replace(",", "")), float(want.replace(",", ""))
    except ValueError:
        return False
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def load_rows(path: Path) -> list[dict[str, Any]]:
    """HLE rows from jsonl, or parquet when pandas / pyarrow is there."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        except ImportError:
            pass
        try:
            import pandas as pd
        except ImportError:
            raise ValueError(f"{path}: reading parquet needs pyarrow or pandas; give a .jsonl file") from None
        return pd.read_parquet(path).to_dict("records")
    rows = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
    return rows


class HLEOptions(BenchmarkOptions):
    """HLE's options; the module docstring says how the judge is chosen."""

    data: Path = Field(description="the questions, a jsonl or parquet file (HLE is not shipped: --option data=PATH)")
    judge: Literal["auto", "llm", "exact"] = Field(
        "auto", description="auto: the judge LLM if one is set, else exact match; llm: a judge LLM; exact: exact match"
    )
    judge_base_url: str | None = Field(None, description=f"the judge LLM's endpoint (else ${ENV_JUDGE_BASE_URL})")
    judge_model: str | None = Field(None, description=f"the judge LLM's model (else ${ENV_JUDGE_MODEL})")
    judge_api_key: str | None = Field(None, description=f"the judge LLM's key (else ${ENV_JUDGE_API_KEY})")
    limit: int | None = Field(None, ge=1, description="the first N questions only")
    category: str | None = Field(None, description="the questions of this category only")
    text_only: bool = Field(False, description="leave out the questions that come with an image")
    intent_chars: int = Field(600, ge=20, description="the memory key: the question cut to this many characters")
    max_tokens: int = Field(4096, ge=1, description="the answer's length limit")


class HLEBenchmark:
    """HLE questions from a user-supplied file, answered in HLE's format and judged by an LLM."""

    name = "hle"
    needs_llm = True
    Options = HLEOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`HLEOptions`, as text (``--option limit=20``) or typed."""
        options = self.options = HLEOptions.parse(self.name, values)
        path = options.data
        if not path.is_file():
            raise ValueError(f"hle: no file {path}")
        tasks = []
        for row in load_rows(path):
            missing = [k for k in ("id", "question", "answer", "answer_type") if row.get(k) in (None, "")]
            if missing:
                raise ValueError(f"{path}: a row lacks {', '.join(missing)}: {str(row)[:200]}")
            if options.category is not None and row.get("category") != options.category:
                continue
            if options.text_only and row.get("image"):
                continue
            question = str(row["question"]).strip()
            intent = question if len(question) <= options.intent_chars else question[: options.intent_chars] + " ..."
            data_row = {k: row.get(k) for k in ("id", "question", "answer", "answer_type", "category")}
            tasks.append(Task(str(row["id"]), intent, data_row, row.get("category") or None))
        self._tasks = tasks[: options.limit]
        self.judge: LLM | None = None
        if options.judge != "exact":
            base_url = options.judge_base_url or os.environ.get(ENV_JUDGE_BASE_URL)
            model = options.judge_model or os.environ.get(ENV_JUDGE_MODEL)
            if base_url and model:
                key = options.judge_api_key or os.environ.get(ENV_JUDGE_API_KEY)
                self.judge = LLM(base_url, model, key, temperature=0.0, max_tokens=1024)
            elif base_url or model or options.judge == "llm":
                raise ValueError(
                    "hle judge: give both judge_base_url and judge_model "
                    f"(or {ENV_JUDGE_BASE_URL} and {ENV_JUDGE_MODEL}), or judge=exact"
                )

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def messages(self, task: Task, memories: Sequence[Memory]) -> list[dict[str, str]]:
        system = SYSTEM_MC if task.data["answer_type"] == "multipleChoice" else SYSTEM_EXACT_ANSWER
        parts = memory_sections(memories, noun="question")
        parts.append(("Question:\n" if parts else "") + str(task.data["question"]))
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def judge_answer(self, task: Task, response: str) -> tuple[Verdict, Usage]:
        """The verdict on one response: the judge LLM's, else (or when it is unusable) exact match."""
        gold, kind = str(task.data["answer"]), str(task.data["answer_type"])
        extracted = extract_answer(response)
        fallback = exact_match(extracted, gold, kind)
        if self.judge is None:
            return Verdict(fallback, "exact", extracted), Usage()
        prompt = JUDGE_PROMPT.format(question=task.data["question"], response=response, correct_answer=gold)
        try:
            reply = self.judge.chat([{"role": "user", "content": prompt}], json_schema=JUDGE_SCHEMA)
        except LLMFormatError as exc:
            return Verdict(fallback, f"exact (judge reply malformed: {str(exc)[:200]})", extracted), Usage()
        data = reply.data
        correct = str(data["correct"]).strip().strip(".'\"*").lower()
        if correct in ("yes", "true", "correct", "y"):
            ok = True
        elif correct in ("no", "false", "incorrect", "n"):
            ok = False
        else:
            return Verdict(fallback, f"exact (judge said correct={data['correct']!r})", extracted), reply.usage
        return (
            Verdict(
                ok,
                "judge",
                str(data["extracted_final_answer"]),
                str(data["reasoning"]),
                _confidence(data["confidence"]),
            ),
            reply.usage,
        )

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        if llm is None:
            raise ValueError("hle needs an LLM")
        reply = llm.chat(self.messages(task, memories), max_tokens=self.options.max_tokens)
        verdict, judge_usage = self.judge_answer(task, reply.text)
        trajectory = (
            f"Question: {task.intent}\n\nResponse:\n{reply.text.strip()[-3000:]}\n\n"
            f"Extracted answer: {verdict.extracted}\nVerdict ({verdict.by}): "
            f"{'correct' if verdict.correct else 'incorrect'}"
        )
        return Episode(
            success=verdict.correct,
            reward=1.0 if verdict.correct else -1.0,
            steps=1,
            trajectory=trajectory,
            usage=reply.usage + judge_usage,
        )


def _confidence(value: Any) -> float | None:
    match = re.search(r"-?\d+(?:\.\d+)?", str(value))
    return float(match.group()) if match else None
