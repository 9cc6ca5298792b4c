"""Every rule an input must pass, declared once as a type, and enforced at every entry point.

The same types annotate the MCP tools' arguments (so the tool input schemas tell clients the bounds, and the
SDK refuses a bad argument before the tool runs) and are checked by :class:`~memrl_mcp.memory.service.MemoryService`
(so the Python API, ``memrl-mcp import`` and ``restore`` refuse exactly what the tools refuse). Checks are
strict: ``"0.5"`` is not a number and ``true`` is not an integer. A refusal names the field and the limit.

The metadata contract (a free JSON object kept with a memory) exists because the stores are less tolerant than
JSON: qdrant-edge replays its write-ahead log through a parser with a recursion limit of 128, so one payload
nested about 122 levels deep is accepted once and makes every later open of the store fail; a 400-digit
integer has no Qdrant representation at all. Hence:

- a JSON object (keys are strings), at most :data:`MAX_METADATA_DEPTH` containers deep;
- keys of at most :data:`MAX_METADATA_KEY_CHARS` characters;
- numbers finite, integers within +-2^53 (what every JSON reader, JavaScript's included, holds exactly);
- strings of valid Unicode (no lone surrogate, which UTF-8 cannot encode);
- at most ``max_metadata_chars`` characters as JSON (a setting).
"""

from __future__ import annotations

import json
import re
import reprlib
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import ErrorDetails

from memrl_mcp.errors import MemoryRequestError

T = TypeVar("T")

Outcome = Literal["success", "failure"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
SortKey = Literal["q", "visits", "updated_at"]
"""What list_memories sorts by: payload fields with a range index, so the engines order them (order_by)."""

MAX_K = 100
MAX_TEXT_QUERY_CHARS = 200
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
CLIENT_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,40}$"
"""The name of the MCP client that wrote a memory, as it is kept and shown beside it (:func:`client_name`)."""
MAX_METADATA_DEPTH = 8
"""Containers (objects and lists) nested in metadata, the top object included. Metadata are labels (a
benchmark, a task id, a few tags): two or three levels is what they use, and 8 leaves room for a small
structured record while staying 16 times below the engines' recursion limit (128), which the memory's own
payload levels (the memory, a recall's report) also count against."""
MAX_METADATA_KEY_CHARS = 128
MAX_SAFE_INTEGER = 2**53
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
"""Unicode categories that show nothing: controls (NUL), formats (BOM, zero-width space and joiners),
surrogates, private use, unassigned, separators (every kind of space)."""


class Rule(Generic[T]):
    """An input type with its check: ``type`` annotates a tool argument, :meth:`check` validates a value."""

    def __init__(self, kind: Any) -> None:
        self.type = kind
        self._adapter: TypeAdapter[T] = TypeAdapter(kind, config=ConfigDict(strict=True))

    def check(self, field: str, value: Any) -> T:
        """The value, or :class:`MemoryRequestError` naming ``field`` (and the part of it that is wrong)."""
        try:
            return self._adapter.validate_python(value)
        except ValidationError as error:
            raise MemoryRequestError(plain_error(error.errors()[0], field)) from None


def plain_error(error: ErrorDetails, field: str = "") -> str:
    """One of pydantic's errors in plain words: ``field.part[2]: what is wrong (the limit), got the value``.
    Pydantic's own text (``1 validation error for ...Arguments``, ``[type=..., input_value=...]`` and a link to
    its documentation) speaks to a Python programmer; this one to whoever sent the value, an agent or an operator.
    Pydantic's message of one error already names the limit ("Input should be less than or equal to 100"); only
    the few that name Python things are reworded."""
    where = field + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
    where = where.removeprefix(".") or "value"
    kind = error["type"]
    if kind == "missing":
        return f"{where}: required"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's, a dataclass's
        return f"{where}: no such field"
    message = REWORDED.get(kind) or error["msg"].removeprefix("Value error, ")
    value, limits = error["input"], error.get("ctx", {})
    if kind == "string_too_long" and isinstance(value, str):  # the length, not a long text again
        return f"{where}: {message}, got {len(value)} characters"
    if kind in ("too_long", "too_short"):  # pydantic's says "items after validation, not 3"
        bound, size = ("at most", limits["max_length"]) if kind == "too_long" else ("at least", limits["min_length"])
        items = "item" if size == 1 else "items"
        return f"{where}: {limits['field_type']} should have {bound} {size} {items}, got {limits['actual_length']}"
    return f"{where}: {message}, got {_shown(value)}"


REWORDED = {
    "dict_type": "Input should be a JSON object",
    "model_type": "Input should be a JSON object",
    "model_attributes_type": "Input should be a JSON object",
    "dataclass_type": "Input should be a JSON object",
}
"""Pydantic's messages that name Python types ("a valid dictionary or instance of TrajectoryStep")."""


def _shown(value: Any) -> str:
    """A short repr, bounded in depth and length (the value may be a hostile one)."""
    return reprlib.repr(value)


# -- text -----------------------------------------------------------------------------------------


def visible(text: str) -> str:
    """Text must hold at least one visible character, and be encodable as UTF-8."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (it holds a lone surrogate)") from None
    if all(unicodedata.category(char) in INVISIBLE_CATEGORIES for char in text):
        raise ValueError(
            "must contain a visible character (spaces, controls such as NUL, BOM and zero-width "
            "characters do not count)"
        )
    return text


def text_rule(max_chars: int) -> Rule[str]:
    return Rule(Annotated[str, Field(min_length=1, max_length=max_chars), AfterValidator(visible)])


def has_word(text: str) -> str:
    """A full-text query matches words (letters and digits): one without any would match nothing."""
    if not any(char.isalnum() for char in text):
        raise ValueError("must contain a word (letters or digits): the text filter matches whole words")
    return text


# -- metadata -------------------------------------------------------------------------------------


def json_object_check(max_chars: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The metadata contract (module docstring) with a size limit of ``max_chars`` characters as JSON."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        _check_tree(value, max_chars)
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False))
        if size > max_chars:
            raise ValueError(f"{size} characters as JSON exceeds the limit of {max_chars}")
        return value

    return check


def _check_tree(root: dict[str, Any], max_nodes: int) -> None:
    """Walk the value without recursion (a hostile depth cannot exhaust the stack), stopping at the first
    violation; every JSON value takes at least one character, so more than ``max_nodes`` nodes is too big."""
    stack: list[tuple[Any, int, str]] = [(root, 1, "")]
    nodes = 0
    while stack:
        value, depth, path = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise ValueError(f"more values than the limit of {max_nodes} characters as JSON can hold")
        where = f"at {path}: " if path else ""
        if isinstance(value, dict):
            if depth > MAX_METADATA_DEPTH:
                raise ValueError(f"{where}nested deeper than {MAX_METADATA_DEPTH} levels")
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"{where}key {_shown(key)} is not a string")
                if len(key) > MAX_METADATA_KEY_CHARS:
                    raise ValueError(f"{where}a key of {len(key)} characters exceeds {MAX_METADATA_KEY_CHARS}")
                _check_string(key, where)
                stack.append((item, depth + 1, f"{path}.{key}" if len(key) <= 40 else f"{path}.{key[:40]}..."))
        elif isinstance(value, list):
            if depth > MAX_METADATA_DEPTH:
                raise ValueError(f"{where}nested deeper than {MAX_METADATA_DEPTH} levels")
            stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                raise ValueError(f"{where}integer of {len(str(abs(value)))} digits is outside +-2^53")
        elif isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"{where}{value} is not a finite number")
        elif isinstance(value, str):
            _check_string(value, where)
        else:
            raise ValueError(f"{where}{type(value).__name__} is not a JSON value")


def _check_string(text: str, where: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{where}a string holds a lone surrogate (not valid Unicode)") from None


def metadata_rule(max_chars: int) -> Rule[dict[str, Any]]:
    return Rule(Annotated[dict[str, Any], AfterValidator(json_object_check(max_chars))])


# -- numbers and names ----------------------------------------------------------------------------


def number_rule(low: float, high: float) -> Rule[float]:
    return Rule(Annotated[float, Field(ge=low, le=high, allow_inf_nan=False)])


def _uuid(text: str) -> str:
    try:
        uuid.UUID(text)
    except ValueError:
        raise ValueError("is not a UUID") from None
    return text


CandidateCount = Annotated[int, Field(ge=1, le=MAX_K, strict=True)]
QWeight = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True)]
Similarity = Annotated[float, Field(ge=-1.0, le=1.0, allow_inf_nan=False, strict=True)]


def _named(namespace: str) -> str:
    """``.`` and ``..`` match the pattern but name nothing: they are path segments, which a client that normalises
    its URIs drops (``memrl://stats/..`` is read as ``memrl://stats``, as a browser's or Electron's URL parser does)."""
    if namespace in (".", ".."):
        raise ValueError(f"{namespace!r} is a path segment, not a name (memrl://stats/{namespace} would lose it)")
    return namespace


NamespaceName = Annotated[str, Field(pattern=NAMESPACE_PATTERN, strict=True), AfterValidator(_named)]
TextQuery = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_QUERY_CHARS, strict=True), AfterValidator(has_word)]

K = Rule[int](CandidateCount)
Q_WEIGHT = Rule[float](QWeight)
DELTA = Rule[float](Similarity)
NAMESPACE = Rule[str](NamespaceName)
POINT_ID = Rule[str](Annotated[str, Field(max_length=36), AfterValidator(_uuid)])
MAX_TIMESTAMP = 253_402_300_799.0
"""9999-12-31T23:59:59Z as a Unix time: the last second a date of four-digit years (ISO 8601, what the tools answer,
Python's ``datetime``) can show."""


def client_name(name: object) -> str | None:
    """The name an MCP client gives itself (its ``initialize``'s ``clientInfo.name``: ``claude-code``) as a memory
    keeps it: letters, digits and ``_.-`` (a space as ``-``), at most 40; None when nothing is left. The name is the
    client's to choose and is shown in a model's prompt beside what the memory says: it cannot carry a line break, a
    quote or a colon, so it cannot pass for the server's words."""
    if not isinstance(name, str):
        return None
    kept = re.sub(r"[^A-Za-z0-9_.-]+", "", "-".join(name.split()))[:40].strip("-.")
    return kept or None


def _dated(seconds: float) -> float:
    if seconds > MAX_TIMESTAMP:
        raise ValueError(f"is after 9999-12-31T23:59:59Z (Unix time {MAX_TIMESTAMP:.0f}), the last time a date shows")
    return seconds


COUNT = Rule[int](Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)])
TIMESTAMP = Rule[float](Annotated[float, Field(ge=0.0, allow_inf_nan=False), AfterValidator(_dated)])
FINITE = Rule[float](Annotated[float, Field(allow_inf_nan=False)])


def is_point_id(text: str) -> bool:
    """True for a string that can name a stored point (a recall or memory id): anything else names none."""
    try:
        POINT_ID.check("id", text)
    except MemoryRequestError:
        return False
    return True


def check_outcome(outcome: str) -> Outcome:
    if outcome not in OUTCOMES:
        raise MemoryRequestError(f"outcome: must be 'success' or 'failure', got {outcome!r}")
    return outcome


def outcome_of(reward: float, neutral: float = 0.0) -> Outcome | None:
    """The outcome of an experience reported without one: success above the scale's middle (``neutral``), failure
    below; none at it (no clear outcome: no procedure to follow, no mistake to avoid)."""
    if reward == neutral:
        return None
    return "success" if reward > neutral else "failure"


MAX_EPISODE_ID_CHARS = 200
EPISODE_ID = text_rule(MAX_EPISODE_ID_CHARS)


CheckKind = Literal["tests", "build", "typecheck", "lint", "check", "edit", "user"]
MAX_CHECK_TEXT = 200  # of a check's command or the user's words: what tells the check apart, never its output
MAX_CHECKS = 64  # a recall keeps its newest checks (what decides its reward is the latest of each command)


class Check(BaseModel):
    """One piece of evidence of how a task goes (:mod:`memrl_mcp.memory.evidence`), in the order it happened: a run
    of a check (``tests``, ``build``, ``typecheck``, ``lint``, or a project's own ``check``) that passed or failed,
    with its counts where its output printed them; an ``edit`` of the files (the runs before it tested other code);
    or the ``user``'s verdict, with their words."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: CheckKind
    passed: bool | None = Field(None, description="Whether it passed (the user: the task succeeded); none for an edit.")
    command: str | None = Field(None, max_length=MAX_CHECK_TEXT, description="What ran (pytest -q tests/).")
    passed_count: int | None = Field(None, ge=0, le=10_000_000, description="Tests or items that passed.")
    failed_count: int | None = Field(None, ge=0, le=10_000_000, description="Tests or items that failed.")
    said: str | None = Field(None, max_length=MAX_CHECK_TEXT, description="The user's words, for kind user.")

    @model_validator(mode="after")
    def _verdict_given(self) -> Check:
        if (self.passed is None) != (self.kind == "edit"):
            raise ValueError("passed: required for a check or the user's verdict, none for an edit")
        return self


CHECKS: Rule[list[Check]] = Rule(Annotated[list[Check], Field(max_length=MAX_CHECKS)])
"""The checks one record_evidence hands in."""


class TrajectoryStep(BaseModel):
    """One decision of an episode: what the agent saw, what it did, the reward that followed (the last: the
    episode's). The bounds are settings: :func:`trajectory_rule` makes the checked kind."""

    model_config = ConfigDict(extra="forbid", strict=True)

    observation: str
    action: str
    reward: float | None = None


def trajectory_rule(
    max_steps: int, max_observation_chars: int, max_action_chars: int, reward: Rule[float]
) -> Rule[list[TrajectoryStep]]:
    """A reported trajectory: 1 to ``max_steps`` steps, each exactly {observation, action, reward}. An error
    names the step and its field (``steps[3].reward``)."""
    step = create_model(
        "TrajectoryStep",
        __base__=TrajectoryStep,
        __doc__="One decision: what the agent saw, what it did, the reward that followed (the last: the episode's).",
        observation=(
            text_rule(max_observation_chars).type,
            Field(description=f"What the agent saw before acting (max {max_observation_chars} characters)."),
        ),
        action=(
            text_rule(max_action_chars).type,
            Field(description=f"What it did (max {max_action_chars})."),
        ),
        reward=(
            reward.type | None,
            Field(
                None,
                description="The reward right after the action (0 for most steps). Leave the last one's out and the "
                "user is asked how the episode went.",
            ),
        ),
    )
    return Rule(Annotated[list[step], Field(min_length=1, max_length=max_steps)])


def rewarded(steps: Sequence[TrajectoryStep]) -> list[tuple[str, str, float]]:
    """A trajectory as (observation, action, reward) triples; every step must name its reward."""
    check_step_rewards(steps, last_may_lack=False)
    return [(step.observation, step.action, step.reward) for step in steps if step.reward is not None]


def check_step_rewards(steps: Sequence[TrajectoryStep], last_may_lack: bool) -> None:
    """Every step of a trajectory names its reward; the last one may lack it when ``last_may_lack`` (the server then
    asks the user how the episode went)."""
    for i, step in enumerate(steps[:-1] if last_may_lack else steps):
        if step.reward is None:
            raise MemoryRequestError(
                f"steps[{i}].reward: required (only the last step's may be left out, for the user to be asked)"
            )


TEXT_QUERY = Rule[str](TextQuery)
FLAG = Rule[bool](bool)
SORT = Rule[str](SortKey)


class Limits:
    """The rules whose bounds are settings (text lengths, reward range, metadata size, trajectories)."""

    def __init__(
        self,
        max_task_chars: int,
        max_experience_chars: int,
        max_metadata_chars: int,
        reward: tuple[float, float],
        trajectory: tuple[int, int, int],
        max_page: int,
        max_trajectory_chars: int,
    ) -> None:
        self.task = text_rule(max_task_chars)
        self.experience = text_rule(max_experience_chars)
        self.metadata = metadata_rule(max_metadata_chars)
        self.reward = number_rule(*reward)
        max_steps, max_observation_chars, max_action_chars = trajectory
        self.observation = text_rule(max_observation_chars)
        self.action = text_rule(max_action_chars)
        self.steps = trajectory_rule(max_steps, max_observation_chars, max_action_chars, self.reward)
        self.page = Rule[int](Annotated[int, Field(ge=1, le=max_page)])
        self.trajectory = text_rule(max_trajectory_chars)  # an episode as text, for a model to write its experience
