"""A benchmark's options (``--option KEY=VALUE``): one pydantic model per benchmark, checked in one place.

Each benchmark module declares its model (``class ControlledOptions(BenchmarkOptions)``: one typed ``Field`` per
option, with its default, bounds and description; checks across options as model validators) and its benchmark class
points to it (``Options = ControlledOptions``) and builds it with :meth:`BenchmarkOptions.parse` from its keyword
arguments. Values come as text from the command line (``families=4``, ``twins=false``) or typed from Python; the
model's lax mode takes both. An empty value (``--option limit=``) is the option's default, so an evaluation's
``--eval-option`` can clear an option of the training.

A refusal is an :class:`OptionError` naming the benchmark, the option and its limit
(``controlled: families: must be at least 2 and at most 16, got 1``); an unknown option names the closest known one.
:meth:`BenchmarkOptions.describe` lists the options with their defaults (``memrl-harness options BENCHMARK``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails


class OptionError(ValueError):
    """A benchmark option refused: its message names the benchmark, the option and the limit."""


def _task_ids(value: Any) -> Any:
    """Task ids as a comma-separated text (``ids=4,1``) or a sequence (from Python): a list of id strings."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, Sequence):
        return [str(part).strip() for part in value]
    return value


# ``ids``: the tasks to run, in this order (each must be in the benchmark's data).
TaskIds = Annotated[tuple[str, ...], BeforeValidator(_task_ids), Field(min_length=1)]


class BenchmarkOptions(BaseModel):
    """The base of every benchmark's options: unknown names refused, values frozen once checked, and no NaN or
    infinity where a number is asked for (a timeout of ``inf`` is no limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_default(cls, values: Any) -> Any:
        """``--option KEY=`` leaves the option at its default (and clears it in ``--eval-option``)."""
        if isinstance(values, Mapping):
            return {k: v for k, v in values.items() if not (isinstance(v, str) and not v.strip())}
        return values

    @classmethod
    def parse(cls, benchmark: str, values: Mapping[str, Any]) -> Self:
        """The options of ``benchmark`` from ``values`` (text or typed), or an :class:`OptionError` naming every
        option refused."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as error:
            raise OptionError(f"{benchmark}: " + "; ".join(cls._explain(e) for e in error.errors())) from None

    @classmethod
    def _explain(cls, error: ErrorDetails) -> str:
        name = str(error["loc"][0]) if error["loc"] else ""  # the option (a model validator's errors have none)
        field = cls.model_fields.get(name)
        kind = error["type"]
        if kind == "extra_forbidden":
            close = difflib.get_close_matches(name, cls.model_fields, n=1)
            known = f"did you mean {close[0]}?" if close else f"known: {', '.join(cls.model_fields)}"
            return f"{name}: unknown option ({known})"
        if kind == "value_error":  # a validator's own words, which name the option
            message = str(error["ctx"]["error"])
        elif kind == "missing" and field is not None:
            message = f"required: {field.description}"
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and field is not None:
            message = f"must be {_limits(field)}, got {error['input']!r}"
        elif kind in ("bool_parsing", "bool_type"):
            message = f"must be true or false, got {error['input']!r}"
        else:  # pydantic's words: "Input should be a valid integer, unable to parse ..." -> "must be a valid integer"
            message = _SHOULD.sub("must", error["msg"].split(",")[0]) + f", got {error['input']!r}"
        return f"{name}: {message}" if name else message

    @classmethod
    def describe(cls) -> str:
        """One line per option: ``name=default``, what values it takes, what it does."""
        rows = [
            (f"{name}={_shown(field)}", _accepts(field), field.description or "")
            for name, field in cls.model_fields.items()
        ]
        left = max(len(r[0]) for r in rows)
        middle = max(len(r[1]) for r in rows)
        return "\n".join(f"  {a:<{left}}  {b:<{middle}}  {c}".rstrip() for a, b, c in rows)


_SHOULD = re.compile(r"^(Input|Value) should")
_BOUNDS = (("ge", "at least"), ("gt", "more than"), ("le", "at most"), ("lt", "less than"))


def _limits(field: FieldInfo) -> str:
    """A field's bounds in words: 'at least 2 and at most 16' ('' when it has none)."""
    bounds = [(words, getattr(m, key)) for m in field.metadata for key, words in _BOUNDS if hasattr(m, key)]
    return " and ".join(f"{words} {value}" for words, value in bounds)


def _accepts(field: FieldInfo) -> str:
    """What an option takes, for the listing: its choices, or its type and bounds."""
    kind: object = field.annotation  # a type form: a class, ``X | None``, ``Annotated[...]``, ``Literal[...]``
    if get_origin(kind) in (Union, UnionType):  # ``X | None``: an option left unset by default
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if get_origin(kind) is Literal:
        return " | ".join(get_args(kind))
    if kind is bool:
        return "true | false"
    names: dict[object, str] = {tuple: "list", Path: "path"}
    name = names.get(get_origin(kind) or kind, getattr(kind, "__name__", str(kind)))
    return f"{name}, {limits}" if (limits := _limits(field)) else name


def _shown(field: FieldInfo) -> str:
    """An option's default as it is written on the command line ('' for unset)."""
    if field.is_required():
        return "(required)"
    if field.default is None:
        return ""
    return str(field.default).lower() if isinstance(field.default, bool) else str(field.default)


class LLBOptions(BenchmarkOptions):
    """What both LifelongAgentBench benchmarks (llb-os, llb-db) take: the tasks, the agent's budget, and the backend
    that runs its actions (each benchmark names its own backends; ``docker`` is one of both)."""

    backend: str = Field(description="where the agent's actions run")
    image: str | None = Field(
        None, description="backend=docker: the container image (default: the one make docker builds)"
    )
    data: Path | None = Field(
        None, description="the tasks' JSON (default: the shared data's; memrl-harness data says where)"
    )
    ids: TaskIds | None = Field(None, description="these tasks only, comma-separated")
    limit: int | None = Field(None, ge=1, description="the first N tasks only")
    max_rounds: int = Field(10, ge=1, description="LLM turns per episode")
    max_output_chars: int = Field(800, ge=50, description="an action's result shown back, cut to this many characters")
    max_tokens: int = Field(512, ge=1, description="the length limit of one turn's answer")

    @model_validator(mode="after")
    def _image_of_a_container(self) -> Self:
        if self.image is not None and self.backend != "docker":
            raise ValueError("image: only with backend=docker")
        return self
