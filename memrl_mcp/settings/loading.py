"""The whole configuration (:class:`Settings`) and where its values come from: arguments, the environment, a YAML
file, the defaults (the order in :mod:`memrl_mcp.settings`); and the settings written back as YAML.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
)

from memrl_mcp.settings.groups import (
    EmbeddingSettings,
    Group,
    LearningSettings,
    LimitSettings,
    NamespaceSettings,
    RetrievalSettings,
    SettingsError,
    SimilaritySettings,
    StepSettings,
    StorageSettings,
    renamed_hint,
    unknown_name,
)
from memrl_mcp.settings.serving import ServingSettings
from memrl_mcp.validation import Limits
from memrl_mcp.variables import ECOSYSTEM_VARIABLES, ENV_PREFIX, OTHER_VARIABLES

JSON_EXAMPLES = {
    "tokens": '[{"name": "desktop", "token": "a-long-random-secret-1", "namespaces": ["alice"]}]',
    "allowed_hosts": '["memory.example.com:*"]',
    "tool_descriptions": '{"recall_experience": "Recall how this team solved similar tasks."}',
    "ui_runs": '["runs/demo"]',
    "other_namespaces": '["team"]',
    "check_commands": '["./run-checks"]',
}
"""The settings given as JSON in the environment (lists and objects), each with a value it accepts."""


GROUPS: dict[str, type[Group]] = {
    "storage": StorageSettings,
    "embeddings": EmbeddingSettings,
    "similarity": SimilaritySettings,
    "retrieval": RetrievalSettings,
    "learning": LearningSettings,
    "steps": StepSettings,
    "limits": LimitSettings,
    "namespaces": NamespaceSettings,
    "serving": ServingSettings,
}
GROUP_OF: dict[str, str] = {name: group for group, model in GROUPS.items() for name in model.model_fields}
"""Every setting's group, by its name (the names are unique across groups: a test checks it)."""


class Settings(BaseModel):
    """Every setting of the server, by group; :func:`load_settings` builds it from its sources."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    storage: StorageSettings = Field(default_factory=StorageSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    similarity: SimilaritySettings = Field(default_factory=SimilaritySettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    steps: StepSettings = Field(default_factory=StepSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    namespaces: NamespaceSettings = Field(default_factory=NamespaceSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def value(self, name: str) -> Any:
        """The value of the setting ``name`` (whatever its group)."""
        return getattr(getattr(self, GROUP_OF[name]), name)

    def origin(self, name: str) -> str:
        """Where the value of ``name`` came from: ``default``, ``argument``, ``environment MEMRL_K1``, ``file ...``."""
        return self._origins.get(name, "default")

    def is_set(self, name: str) -> bool:
        """True when ``name`` was given by some source (not left at its default)."""
        return name in self._origins

    def input_limits(self) -> Limits:
        """The input rules whose bounds these settings give (text lengths, reward range, trajectories, pages)."""
        limits, learning = self.limits, self.learning
        return Limits(
            limits.max_task_chars,
            limits.max_experience_chars,
            limits.max_metadata_chars,
            (learning.reward_min, learning.reward_max),
            (limits.max_trajectory_steps, limits.max_observation_chars, limits.max_action_chars),
            limits.max_list_page,
            limits.max_trajectory_chars,
        )


def load_settings(
    config_file: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    relative_to: Path | None = None,
    **values: Any,
) -> Settings:
    """The settings from ``values`` (by setting name), the environment (``os.environ`` unless given), the YAML file
    ``config_file`` and the defaults, in that order of precedence (module docstring). ``relative_to``: the folder
    that relative paths (the config file's, every path setting's) mean, when it is not this process's own working
    folder (the local server reads the settings of a session started elsewhere)."""
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get("MEMRL_CONFIG") or None
    if config_file is not None and relative_to is not None:
        config_file = relative_to / config_file
    layers: list[tuple[str, dict[str, Any]]] = []  # lowest precedence first: (where, {name: value})
    if config_file is not None:
        layers.append((f"file {config_file}", _from_file(Path(config_file))))
    layers += _from_environment(environ)
    unknown = [name for name in values if name not in GROUP_OF]
    if unknown:
        raise SettingsError(unknown_name(unknown[0], GROUP_OF, "argument"))
    layers.append(("argument", dict(values)))
    grouped: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for where, layer in layers:
        for name, value in layer.items():
            grouped.setdefault(GROUP_OF[name], {})[name] = value
            origins[name] = where
    try:
        settings = Settings.model_validate(grouped)
    except ValidationError as error:
        raise SettingsError("invalid settings: " + "; ".join(_problem(e, origins) for e in error.errors())) from None
    if relative_to is not None:
        settings = _absolute(settings, relative_to)
    settings._origins.update(origins)
    return settings


def _absolute(settings: Settings, folder: Path) -> Settings:
    """``settings`` with each relative path (a path setting, or each path of a list of them) taken under ``folder``."""

    def absolute(value: Any) -> Any:
        if isinstance(value, Path):
            return value if value.is_absolute() else folder / value
        return [absolute(item) for item in value] if isinstance(value, list) else value

    groups = {
        group: getattr(settings, group).model_copy(
            update={name: absolute(getattr(getattr(settings, group), name)) for name in model.model_fields}
        )
        for group, model in GROUPS.items()
    }
    return settings.model_copy(update=groups)


def _from_file(path: Path) -> dict[str, Any]:
    """The settings of a YAML file, each under its group; a flat or unknown key is refused with the right place."""
    try:
        content = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path}: file not found") from None
    except OSError as error:
        raise SettingsError(f"config file {path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"config file {path}: not YAML ({error})") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise SettingsError(f"config file {path}: must be a mapping of groups ({', '.join(GROUPS)})")
    found: dict[str, Any] = {}
    for group, entries in content.items():
        if group in GROUP_OF:
            raise SettingsError(
                f"config file {path}: {group} goes under {GROUP_OF[group]}: (each setting sits under its group)"
            )
        if group not in GROUPS:
            raise SettingsError(f"config file {path}: " + unknown_name(str(group), GROUPS, "group"))
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise SettingsError(f"config file {path}: {group} must be a mapping of settings")
        for name, value in entries.items():
            if GROUP_OF.get(name) != group:
                where = f" (it belongs under {GROUP_OF[name]}:)" if name in GROUP_OF else renamed_hint(str(name))
                raise SettingsError(f"config file {path}: {group}.{name}: no such setting in {group}{where}")
            found[name] = value
    return found


def _from_environment(environ: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """The settings of the environment: the ecosystem's names first, then ``MEMRL_*`` (which win)."""
    ecosystem = {
        f"environment {variable}": {name: _parse(name, variable, environ[variable])}
        for name, variable in ECOSYSTEM_VARIABLES.items()
        if variable in environ
    }
    layers = [(where, layer) for where, layer in ecosystem.items()]
    known = {ENV_PREFIX + name.upper(): name for name in GROUP_OF}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable == "MEMRL_CONFIG" or variable in OTHER_VARIABLES:
            continue
        if variable not in known:
            raise SettingsError(unknown_name(variable, known, "environment variable", prefix=ENV_PREFIX))
        name = known[variable]
        layers.append((f"environment {variable}", {name: _parse(name, variable, environ[variable])}))
    return layers


def _parse(name: str, variable: str, text: str) -> Any:
    """An environment value: JSON for a list or an object (``MEMRL_TOKENS``), else the text (pydantic converts it)."""
    if name in JSON_EXAMPLES:
        try:
            return json.loads(text)
        except ValueError:
            raise SettingsError(f"{variable}: not JSON; give {name} as JSON, e.g. {JSON_EXAMPLES[name]}") from None
    return text


def _problem(error: Any, origins: Mapping[str, str]) -> str:
    """One validation error as ``name (from where): message``."""
    location = [str(part) for part in error["loc"]]
    name = next((part for part in reversed(location) if part in GROUP_OF), location[-1] if location else "settings")
    inner = ".".join(location[location.index(name) + 1 :]) if name in location else ""
    where = f" (from {origins[name]})" if name in origins else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{name}{'.' + inner if inner else ''}{where}: {message}"


def as_yaml(settings: Settings | None = None) -> str:
    """The settings as a YAML file of groups. Without ``settings``: the defaults, each with its description above it
    (the annotated file shipped as ``memrl_mcp/defaults.yaml``); with them: their values, each with where it came
    from (``memrl-mcp config``). Secrets are shown as ``"***"``."""
    lines = [
        "# memrl-mcp settings: memrl-mcp --config FILE (or MEMRL_CONFIG=FILE). Each setting can also be set as an",
        "# environment variable, MEMRL_ + its name in upper case (the environment wins over this file).",
    ]
    for group, model in GROUPS.items():
        lines += ["", f"# {(model.__doc__ or group).splitlines()[0].replace('``', '')}", f"{group}:"]
        for name, field in model.model_fields.items():
            if settings is None:
                lines += ["  # " + line for line in textwrap.wrap((field.description or "").replace("``", ""), 110)]
                if name == "data_dir":  # its default is the platform's folder, not a constant
                    lines.append(f"  # {name}: ~/.local/share/memrl-mcp")
                    continue
                lines.append(f"  {name}: {_yaml_value(getattr(getattr(Settings(), group), name))}")
            else:
                value = _yaml_value(settings.value(name))
                lines.append(f"  {name}: {value}  # {settings.origin(name)}")
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    """One value as YAML flow text, secrets masked."""
    if isinstance(value, SecretStr):
        return '"***"'
    if isinstance(value, list):
        value = [_plain(item) for item in value]
    return (
        yaml.safe_dump(_plain(value), default_flow_style=True, width=1 << 20).removesuffix("\n").removesuffix("\n...")
    )


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        dumped = value.model_dump(mode="json")
        return {key: "***" if key == "token" and item else item for key, item in dumped.items()}
    return str(value) if isinstance(value, Path) else value
