"""The harness's one door to a chat LLM: any OpenAI-compatible endpoint, retried, metered.

The same code talks to OpenAI, vLLM, Ollama or llama.cpp's server (``memrl_harness/local_llm.py``
starts a small local one), so a benchmark result depends on the model, never on the client.
Retries are done here, not by the ``openai`` client (its ``max_retries`` is 0), so the backoff
is explicit and tested: connection errors, timeouts, 408, 429 and 5xx are retried with
exponential backoff and jitter (a ``Retry-After`` header is honoured up to ``backoff_max``);
any other 4xx fails at once, since sending the same bad request again cannot help.

Structured output: OpenAI, vLLM, Ollama and llama.cpp's own ``llama-server`` take
``response_format={"type": "json_schema", ...}``; llama-cpp-python's server (the local default)
only knows ``{"type": "json_object", "schema": ...}`` and answers the first with a 500. In the
default ``structured_output="auto"`` the client sends ``json_schema`` and, if the server rejects
that field, switches to ``json_object`` for this and every later call.

Environment (``LLM.from_env``):

- ``MEMRL_LLM_BASE_URL``: the endpoint, e.g. ``http://127.0.0.1:8080/v1`` or
  ``https://api.openai.com/v1`` (required, here or in the run's settings file).
- ``MEMRL_LLM_MODEL``: the model name sent with each request (required, here or in the run's settings file).
- ``MEMRL_LLM_API_KEY``: the key; unset falls back to ``OPENAI_API_KEY``, then to ``"unused"``
  (local servers ignore it, the client still wants one). Never in a file.

The endpoint and the model may also sit in the run's settings file (``memrl-harness run --config``), in an ``llm:``
group beside the memory's constants (:class:`LLMSettings`); the environment wins, as it does over memrl-mcp's file.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
import openai
from pydantic import BaseModel, ConfigDict, Field

ENV_BASE_URL = "MEMRL_LLM_BASE_URL"
ENV_MODEL = "MEMRL_LLM_MODEL"
ENV_API_KEY = "MEMRL_LLM_API_KEY"

Message = Mapping[str, Any]
StructuredOutput = Literal["auto", "json_schema", "json_object"]
log = logging.getLogger(__name__)
_RETRY_STATUS = frozenset({408, 429})


@dataclass
class Usage:
    """Tokens and calls spent; summed per episode, per run and per LLM object."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.calls + other.calls,
        )

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Reply:
    """One chat answer: its text, the parsed object when a schema was asked for, its cost."""

    text: str
    usage: Usage = field(default_factory=Usage)
    data: Any = None
    finish_reason: str | None = None


class LLMSettings(BaseModel):
    """The ``llm:`` group of a run's settings file: where the run's LLM is. Its key is not one of them: a settings
    file is copied, shared and committed with the results, so the key stays in ``MEMRL_LLM_API_KEY``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    base_url: str | None = Field(None, description="The OpenAI-compatible endpoint (MEMRL_LLM_BASE_URL wins).")
    model: str | None = Field(None, description="The model name (MEMRL_LLM_MODEL wins).")


class LLMError(RuntimeError):
    """A chat call failed for good (after any retries); the message says why and where.

    ``status`` is the HTTP status of the last answer, when there was one.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LLMFormatError(LLMError):
    """The model's answer was not JSON valid for the requested schema, even after one retry."""


class _FormatRejected(LLMError):
    """The server refused the ``json_schema`` response format (auto mode falls back)."""


class LLM:
    """A thread-safe chat client for one model behind an OpenAI-compatible endpoint.

    ``temperature=0`` and a fixed ``seed`` keep runs as repeatable as the server allows; the
    running ``usage`` is summed under a lock so worker threads can share one object.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        max_tokens: int | None = 512,
        timeout: float = 120.0,
        max_retries: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        structured_output: StructuredOutput = "auto",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not base_url:
            raise ValueError("LLM needs a base_url (e.g. http://127.0.0.1:8080/v1)")
        if not model:
            raise ValueError("LLM needs a model name")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = base_url
        self.model = model
        self.temperature = temperature
        self.seed = seed
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.structured_output: StructuredOutput = structured_output
        self._sleep = sleep
        key = api_key or os.environ.get("OPENAI_API_KEY") or "unused"
        self._client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)
        self._lock = threading.Lock()
        self._usage = Usage()
        self._rng = random.Random()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, settings: LLMSettings | None = None, **overrides: Any
    ) -> LLM:
        """Build from ``MEMRL_LLM_*`` variables, else the run file's ``settings`` (see the module doc); keyword
        arguments win."""
        env = os.environ if environ is None else environ
        settings = settings or LLMSettings()
        base_url = overrides.pop("base_url", None) or env.get(ENV_BASE_URL) or settings.base_url
        model = overrides.pop("model", None) or env.get(ENV_MODEL) or settings.model
        missing = [name for name, value in ((ENV_BASE_URL, base_url), (ENV_MODEL, model)) if not value]
        if missing:
            raise LLMError(
                f"set {' and '.join(missing)} (or base_url and model in the llm: group of the --config file) to "
                "point the harness at an OpenAI-compatible endpoint (or start the local one: python -m "
                "memrl_harness.local_llm)"
            )
        api_key = overrides.pop("api_key", None) or env.get(ENV_API_KEY) or env.get("OPENAI_API_KEY") or "unused"
        return cls(str(base_url), str(model), api_key, **overrides)

    @property
    def usage(self) -> Usage:
        """Everything this object has spent so far (a copy)."""
        with self._lock:
            return Usage(self._usage.prompt_tokens, self._usage.completion_tokens, self._usage.calls)

    def close(self) -> None:
        self._client.close()

    def chat(
        self,
        messages: Sequence[Message],
        *,
        json_schema: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> Reply:
        """Send one chat; with ``json_schema`` ask for structured output and parse it.

        The schema goes out as ``response_format={"type": "json_schema", ...,"strict": True}``
        (or as ``json_object`` + ``schema``, see the module doc), so for OpenAI it must list
        every property as required and set ``additionalProperties: false``. An answer that is not
        valid JSON for the schema is asked for once more, then raises :class:`LLMFormatError`.
        """
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(message) for message in messages],
            "temperature": self.temperature,
        }
        if self.seed is not None:
            request["seed"] = self.seed
        limit = max_tokens if max_tokens is not None else self.max_tokens
        if limit is not None:
            request["max_tokens"] = limit
        if json_schema is None:
            return self._complete(request)
        spent = Usage()
        problem = ""
        for _ in range(2):
            reply = self._complete_structured(request, json_schema)
            spent = spent + reply.usage
            try:
                data = parse_json_reply(reply.text, json_schema)
            except ValueError as exc:
                problem = str(exc)
                if reply.finish_reason == "length":
                    problem += f" (the answer was cut at max_tokens={limit})"
                continue
            return Reply(reply.text, spent, data, reply.finish_reason)
        raise LLMFormatError(f"{self.model} at {self.base_url} gave no valid JSON for the schema twice: {problem}")

    def _complete_structured(self, request: dict[str, Any], schema: Mapping[str, Any]) -> Reply:
        """One completion with the schema in the format this server takes (learnt in auto mode).

        The switch to ``json_object`` sticks only once a ``json_object`` request has worked, so
        an unrelated error cannot flip a server that does take ``json_schema``.
        """
        mode = self.structured_output
        kind = "json_object" if mode == "json_object" else "json_schema"
        request["response_format"] = _response_format(schema, kind)
        try:
            return self._complete(request, detect_format_rejection=mode == "auto")
        except _FormatRejected as rejected:
            request["response_format"] = _response_format(schema, "json_object")
            try:
                reply = self._complete(request)
            except LLMError as exc:
                raise LLMError(f"{rejected}; json_object + schema failed too: {exc}", exc.status) from exc
        with self._lock:
            if self.structured_output == "auto":
                log.warning("%s rejects json_schema response_format; using json_object + schema", self.base_url)
                self.structured_output = "json_object"
        return reply

    def _complete(self, request: dict[str, Any], *, detect_format_rejection: bool = False) -> Reply:
        """One completion, retried on transient failures; adds its usage to the running total."""
        attempt = 0
        while True:
            try:
                response = self._client.chat.completions.create(**request)
            except openai.APIStatusError as exc:
                if detect_format_rejection and _rejects_format(exc):
                    raise _FormatRejected(
                        f"{self.base_url} rejected response_format json_schema (HTTP {exc.status_code}): "
                        f"{_error_text(exc)}",
                        exc.status_code,
                    ) from exc
                if not _retryable_status(exc.status_code):
                    raise LLMError(
                        f"{self.model} at {self.base_url} refused the request "
                        f"(HTTP {exc.status_code}, not retried): {_error_text(exc)}",
                        exc.status_code,
                    ) from exc
                if attempt >= self.max_retries:
                    raise LLMError(
                        f"{self.model} at {self.base_url} still failing after {attempt + 1} tries: "
                        f"HTTP {exc.status_code}: {_error_text(exc)}",
                        exc.status_code,
                    ) from exc
                self._sleep(self._backoff(attempt, _retry_after(exc)))
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                if attempt >= self.max_retries:
                    what = f"timed out (timeout={self.timeout}s)" if isinstance(exc, openai.APITimeoutError) else exc
                    raise LLMError(
                        f"{self.model} at {self.base_url} unreachable after {attempt + 1} tries: {what}"
                    ) from exc
                self._sleep(self._backoff(attempt, None))
            else:
                return self._reply(response)
            attempt += 1

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential with full jitter in [d/2, d]; never below the server's Retry-After."""
        delay = min(self.backoff_max, self.backoff_base * 2**attempt)
        with self._lock:
            delay *= self._rng.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max))
        return delay

    def _reply(self, response: Any) -> Reply:
        if not response.choices:
            raise LLMError(f"{self.model} at {self.base_url} answered with no choices")
        choice = response.choices[0]
        raw = response.usage
        used = Usage(
            int(getattr(raw, "prompt_tokens", 0) or 0), int(getattr(raw, "completion_tokens", 0) or 0), calls=1
        )
        with self._lock:
            self._usage = self._usage + used
        return Reply(choice.message.content or "", used, None, choice.finish_reason)


def parse_json_reply(text: str, schema: Mapping[str, Any]) -> Any:
    """The JSON in ``text``, validated against ``schema``; ``ValueError`` says what is wrong.

    Servers that ignore ``response_format`` often wrap the JSON in a code fence or a sentence,
    so the first ``{...}``/``[...]`` span is tried when the whole text does not parse.
    """
    candidates = [text.strip()]
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    for opener, closer in ("{}", "[]"):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    data: Any = None
    for candidate in candidates:
        try:
            data = json.loads(candidate, strict=False)  # raw newlines in strings: grammar output has them
        except json.JSONDecodeError:
            continue
        break
    else:
        raise ValueError(f"not JSON: {_clip(text)!r}")
    try:
        jsonschema.validate(data, dict(schema))
    except jsonschema.ValidationError as exc:
        raise ValueError(f"JSON does not match the schema ({exc.message}): {_clip(text)!r}") from None
    return data


def _response_format(schema: Mapping[str, Any], kind: str) -> dict[str, Any]:
    if kind == "json_object":  # llama-cpp-python, Together, Anyscale: a grammar from the schema
        return {"type": "json_object", "schema": dict(schema)}
    return {
        "type": "json_schema",
        "json_schema": {"name": _schema_name(schema), "schema": dict(schema), "strict": True},
    }


def _rejects_format(exc: openai.APIStatusError) -> bool:
    """An error that names the field (llama-cpp-python answers its validation error with a 500)."""
    if exc.status_code in _RETRY_STATUS:
        return False
    message = str(exc.body or exc.message).lower()
    return "response_format" in message or "json_schema" in message or "json_object" in message


def _schema_name(schema: Mapping[str, Any]) -> str:
    """OpenAI wants a name matching ``[A-Za-z0-9_-]{1,64}``; the schema's title if it has one."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or "reply"))[:64]
    return name or "reply"


def _retryable_status(status: int) -> bool:
    return status in _RETRY_STATUS or status >= 500


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        message = body.get("message") or (body.get("error") or {}).get("message")
        if message:
            return _clip(str(message))
    return _clip(str(exc.message))


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# --- MemRL experiences ---------------------------------------------------------------------

SUMMARY_SYSTEM = "You write short notes that an AI agent will read before attempting a similar task."
SUCCESS_INSTRUCTION = (
    "The agent SUCCEEDED at the task below. Write the procedure that worked as 3 to 5 numbered, "
    "high-level steps that would also work on similar tasks. Plain text, no preamble, at most 80 words."
)
FAILURE_INSTRUCTION = (
    "The agent FAILED at the task below. Write a short reflection: what went wrong, and what to "
    "avoid or do differently next time. Plain text, no preamble, 2 to 4 sentences, at most 80 words."
)
SUMMARY_MAX_TOKENS = 160
TRAJECTORY_CHARS = 2400
TASK_CHARS = 600


def truncate_middle(text: str, limit: int, head_share: float = 0.4) -> str:
    """Keep the start (the setup) and the end (where it worked or broke), cut the middle.

    Cuts fall on line breaks when one is near, so a kept step is not half a step.
    """
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters omitted ...]\n"
    budget = max(0, limit - len(marker.format(len(text))))
    head_len = int(budget * head_share)
    tail_len = budget - head_len
    head, tail = text[:head_len], text[len(text) - tail_len :] if tail_len else ""
    newline = head.rfind("\n")
    if newline >= head_len // 2:
        head = head[: newline + 1]
    newline = tail.find("\n")
    if 0 <= newline <= tail_len // 2:
        tail = tail[newline + 1 :]
    return head.rstrip("\n") + marker.format(len(text) - len(head) - len(tail)) + tail


_CONTEXT_OVERFLOW = re.compile(r"context (length|size|window)|too long|exceeds? .*context|maximum .*tokens", re.I)


def is_context_overflow(error: LLMError) -> bool:
    """The prompt did not fit the model's context (OpenAI, vLLM, llama.cpp wordings): a 400/413."""
    return error.status in (400, 413) and bool(_CONTEXT_OVERFLOW.search(str(error)))


def experience_messages(
    task: str, trajectory: str, success: bool, *, max_chars: int = TRAJECTORY_CHARS
) -> list[dict[str, str]]:
    """The prompt for :func:`summarize_experience`, sized for a 2048-token context.

    2400 characters of trajectory are ~1000 tokens of log text on SmolLM2's tokenizer (~1200
    at a worst-case 2 characters a token), which leaves room for the instructions and the
    160-token answer; prompt processing on one CPU thread runs ~100 tokens/s, so it also
    bounds the cost of a summary to ~10 s. The task gets a quarter of the trajectory's share.
    """
    instruction = SUCCESS_INSTRUCTION if success else FAILURE_INSTRUCTION
    user = (
        f"{instruction}\n\nTask:\n{truncate_middle(task.strip(), min(TASK_CHARS, max(100, max_chars // 4)), 0.7)}\n\n"
        f"What the agent did ({'success' if success else 'failure'}):\n"
        f"{truncate_middle(trajectory.strip(), max_chars)}\n\n" + ("Steps:" if success else "Reflection:")
    )
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]


def summarize_experience(llm: LLM, task: str, trajectory: str, success: bool) -> tuple[str, Usage]:
    """The experience MemRL stores: a 3-5 step script on success, a reflection on failure.

    Characters are only a guess at tokens (digits, symbols and non-Latin text take a token or
    more each), so a prompt the server finds too long is sent again with half the trajectory.
    An empty answer falls back to the end of the trajectory, so a memory is never blank.
    """
    max_chars = TRAJECTORY_CHARS
    while True:
        messages = experience_messages(task, trajectory, success, max_chars=max_chars)
        try:
            reply = llm.chat(messages, max_tokens=SUMMARY_MAX_TOKENS)
            break
        except LLMError as exc:
            if max_chars <= 300 or not is_context_overflow(exc):
                raise
            max_chars //= 2
    text = reply.text.strip()
    if not text:
        outcome = "Succeeded" if success else "Failed"
        text = f"{outcome}; last steps:\n{truncate_middle(trajectory.strip(), 600, 0.0)}"
    return text, reply.usage
