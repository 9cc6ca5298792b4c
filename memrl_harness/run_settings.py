"""A run's settings file (``memrl-harness run --config FILE``): memrl-mcp's settings by group, as ``memrl-mcp --config``
reads them, and beside them the harness's own ``llm:`` group, the endpoint and model of the run's LLM, so that one
file says what a run ran with:

.. code-block:: yaml

    llm:
      base_url: http://127.0.0.1:8080/v1
      model: smollm2-135m-instruct
    retrieval:
      k1: 5

memrl-mcp refuses a group it does not know (a typo must not leave a default in place), so the harness takes ``llm:``
out and hands the server the rest, written to the run folder (``memory-settings.yaml``). The LLM's key is refused in
the file: it stays in the environment (``MEMRL_LLM_API_KEY``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from memrl_harness.llm import ENV_API_KEY, LLMSettings
from memrl_mcp.settings import GROUPS, unknown_name
from memrl_mcp.validation import plain_error

LLM_GROUP = "llm"


@dataclass(frozen=True)
class RunSettings:
    """A run's settings file, split: the LLM's (the harness's) and the memory's (memrl-mcp's, by group)."""

    llm: LLMSettings
    memory: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> RunSettings:
        """The file's two parts; a file that is no YAML mapping, a group neither the harness's nor memrl-mcp's, a key
        in it, or a bad ``llm:`` entry is a ``ValueError`` naming it (memrl-mcp checks the settings in its groups
        when it reads them)."""
        try:
            content = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"--config {path}: cannot read it as YAML ({error})") from None
        if not isinstance(content, dict):
            raise ValueError(f"--config {path}: must be a mapping of groups (llm: and memrl-mcp's)")
        for group in content:
            if group != LLM_GROUP and group not in GROUPS:
                raise ValueError(
                    f"--config {path}: " + unknown_name(str(group), frozenset({LLM_GROUP, *GROUPS}), "group")
                )
        llm = content.pop(LLM_GROUP, None) or {}
        if isinstance(llm, dict) and "api_key" in llm:
            raise ValueError(
                f"--config {path}: llm.api_key: a key does not belong in a settings file (it is copied, shared and "
                f"kept with the results); set {ENV_API_KEY} in the environment instead"
            )
        try:
            return cls(LLMSettings.model_validate(llm), content)
        except ValidationError as error:
            raise ValueError(f"--config {path}: {plain_error(error.errors()[0], LLM_GROUP)}") from None

    def environment(self) -> dict[str, str]:
        """The memory's settings as memrl-mcp's ``MEMRL_*`` variables (a list or a mapping as JSON, as memrl-mcp
        reads them there); a setting left empty keeps its default."""

        def variable(value: Any) -> str:
            if isinstance(value, bool):
                return str(value).lower()
            return json.dumps(value) if isinstance(value, list | dict) else str(value)

        return {
            f"MEMRL_{name.upper()}": variable(value)
            for group in self.memory.values()
            for name, value in (group or {}).items()
            if value is not None
        }

    def write_memory(self, path: Path) -> Path:
        """The memory's groups as a memrl-mcp settings file at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.memory, sort_keys=False))
        return path
