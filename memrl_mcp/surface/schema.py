"""What a client sees of a tool (:class:`MemoryTool`): its arguments (:class:`Arguments`, from its request), strictly
checked, refusals in plain words, a compact input schema and no output schema."""

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Self, get_args, get_type_hints

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from memrl_mcp.requests import Arg
from memrl_mcp.settings import Settings
from memrl_mcp.validation import MAX_CHECKS, Limits, plain_error

STRICT = ConfigDict(strict=True, extra="forbid")
SCHEMA_BRANCHES = ("properties", "$defs")
"""Keywords of a JSON schema whose value maps names to schemas (a property may be called ``title``)."""


class MemoryTool(Tool):
    """A tool as this server lists and runs it.

    - Its arguments are checked strictly: the SDK builds the argument model from the signature in pydantic's lax
      mode ("0.5" passes as a number, true as an integer) and ignores unknown arguments, so a client's typo would go
      unnoticed; :meth:`strict` closes it, and the input schema says so (``additionalProperties: false``).
    - A refused argument is named in plain words with its limit (:func:`~memrl_mcp.validation.plain_error`), not in
      pydantic's report (its model's name, ``[type=..., input_value=...]``, a link to its documentation).
    - Its input schema is compact (:func:`compact_schema`) and it lists no output schema: the result is still
      structured content of a known shape, documented in docs/tools.md. The output schemas were three fifths of
      what every turn of an agent paid for the tool list (docs/tools.md has the figures); an agent reads the
      result's field names, and a client validating results would also refuse the ISO 8601 times of the JSON (the
      schemas pydantic derives describe the Python side's floats).
    """

    @classmethod
    def strict(cls, fn: Callable[..., object], title: str, description: str, annotations: ToolAnnotations) -> Self:
        tool = cls.from_function(fn, title=title, description=description, annotations=annotations)
        lax = tool.fn_metadata.arg_model
        strict: type[BaseModel] = type(lax.__name__, (lax,), {"model_config": STRICT, "__module__": __name__})
        metadata = tool.fn_metadata.model_copy(update={"arg_model": strict})
        schema = compact_schema(strict.model_json_schema(by_alias=True))
        made = tool.model_copy(update={"fn_metadata": metadata, "parameters": schema})
        assert isinstance(made, cls)  # the SDK's from_function builds an instance of the class it is called on
        return made

    @property
    def output_schema(self) -> dict[str, Any] | None:
        return None

    async def run(self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False) -> Any:
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as error:  # the SDK's, around the arguments' ValidationError; not a crash (Unexpected...)
            cause = error.__cause__
            if isinstance(error, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            problems = "; ".join(self._plain(problem) for problem in cause.errors())
            raise ToolError(f"Error executing tool {self.name}: {problems}") from cause

    def _plain(self, problem: ErrorDetails) -> str:
        if problem["type"] == "extra_forbidden" and len(problem["loc"]) == 1:
            known = ", ".join(self.parameters["properties"])
            return f"{problem['loc'][0]}: no such argument ({self.name} takes {known})"
        return plain_error(problem)


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema without what tells a model nothing, every bound kept: the titles pydantic derives from the
    names (``"title": "Recall Id"``), and the ``null`` branch and ``null`` default of an optional argument (omit it;
    the tool still takes an explicit null): a quarter of the input schemas (docs/tools.md has the figures)."""
    compact = {key: value for key, value in schema.items() if key != "title"}
    variants = compact.get("anyOf")
    if isinstance(variants, list) and {"type": "null"} in variants and len(variants) == 2:
        (kept,) = [variant for variant in variants if variant != {"type": "null"}]
        del compact["anyOf"]
        compact = {**kept, **compact}
        if compact.get("default", ...) is None:
            del compact["default"]
    for key, value in compact.items():
        if key in SCHEMA_BRANCHES and isinstance(value, dict):
            compact[key] = {name: compact_schema(branch) for name, branch in value.items()}
        elif isinstance(value, dict):
            compact[key] = compact_schema(value)
        elif isinstance(value, list):
            compact[key] = [compact_schema(item) if isinstance(item, dict) else item for item in value]
    return compact


class Arguments:
    """A request's fields as a tool's arguments (:class:`~memrl_mcp.requests.Arg`): each with the bound its rule
    holds in ``limits`` where that bound is a setting, and its description filled in from ``values`` (the settings
    a description names, :func:`argument_values`)."""

    def __init__(self, limits: Limits, values: Mapping[str, object]) -> None:
        self._limits = limits
        self._values = values

    def parameters(self, request: type[Any]) -> list[inspect.Parameter]:
        hints = get_type_hints(request, include_extras=True)
        parameters = []
        for field in dataclasses.fields(request):
            kind, *metadata = get_args(hints[field.name])
            (arg,) = (item for item in metadata if isinstance(item, Arg))
            if arg.bound is not None:
                bounded = getattr(self._limits, arg.bound).type
                kind = bounded | None if field.default is None else bounded
            kept = [item for item in metadata if not isinstance(item, Arg)]
            described = Annotated[(kind, *kept, Field(description=arg.description.format_map(self._values)))]  # type: ignore[valid-type]
            default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
            parameters.append(
                inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=described)
            )
        return parameters


def argument_values(settings: Settings, delta: float) -> dict[str, object]:
    """What the arguments' descriptions may name: the limits' settings, the reward range, and the defaults of
    recall (``delta``: the similarity threshold in effect, the embedder's when not set)."""
    scale, retrieval = settings.learning.reward_scale, settings.retrieval
    return {
        **settings.limits.model_dump(),
        "reward_min": scale.low,
        "reward_max": scale.high,
        "reward_neutral": scale.neutral,
        "k1": retrieval.k1,
        "k2": retrieval.k2,
        "q_weight": retrieval.q_weight,
        "delta": delta,
        "step_k": settings.steps.step_k,
        "max_checks": MAX_CHECKS,
    }
