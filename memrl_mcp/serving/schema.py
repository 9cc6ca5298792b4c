"""What a client sees of a tool (:class:`MemoryTool`): strictly checked arguments, refusals in plain words, a compact
input schema and no output schema."""

from collections.abc import Callable
from typing import Any, Self

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from memrl_mcp.validation import plain_error

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
        strict = type(lax.__name__, (lax,), {"model_config": STRICT, "__module__": __name__})
        metadata = tool.fn_metadata.model_copy(update={"arg_model": strict})
        schema = compact_schema(strict.model_json_schema(by_alias=True))
        return tool.model_copy(update={"fn_metadata": metadata, "parameters": schema})

    @property
    def output_schema(self) -> dict[str, Any] | None:  # type: ignore[override]
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
