"""Settings: defaults from the paper, a YAML file of groups, environment precedence, errors that name the setting and
where it came from, unknown names refused with the closest known one, and the annotated defaults file."""

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import get_origin

import pytest
import yaml

from memrl_mcp.settings import GROUP_OF, GROUPS, SettingsError, as_yaml, load_settings
from memrl_mcp.settings.loading import JSON_EXAMPLES


def test_paper_defaults() -> None:
    s = load_settings(environ={})
    r, learning = s.retrieval, s.learning
    assert (r.k1, r.k2, r.q_weight, learning.alpha, learning.q_init_success, learning.q_init_failure) == (
        5,
        3,
        0.5,
        0.3,
        0.0,
        0.0,
    )
    assert (learning.reward_min, learning.reward_max, r.epsilon) == (-1.0, 1.0, 0.0)
    assert (s.embeddings.embedder, s.storage.embedded_engine) == ("minilm", "edge")


def test_every_setting_has_one_name_across_the_groups() -> None:
    names = [name for model in GROUPS.values() for name in model.model_fields]
    assert len(names) == len(set(names)) == len(GROUP_OF)


def test_the_shipped_defaults_file_is_the_defaults_and_lists_every_setting() -> None:
    shipped = resources.files("memrl_mcp").joinpath("defaults.yaml")
    text = shipped.read_text()
    assert text == as_yaml(), "memrl_mcp/defaults.yaml is stale: regenerate it with `memrl-mcp config --defaults`"
    loaded = load_settings(Path(str(shipped)), environ={})
    assert loaded.model_dump() == load_settings(environ={}).model_dump()
    listed = {line.strip().lstrip("# ").split(":")[0] for line in text.splitlines() if line.startswith("  ")}
    assert set(GROUP_OF) <= listed  # data_dir as a comment: its default is the platform's folder


def test_environment_wins_over_the_file_and_each_value_says_where_it_came_from(tmp_path: Path) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text("retrieval:\n  k1: 10\n  k2: 5\nlearning:\n  alpha: 0.1\n")
    s = load_settings(config, environ={"MEMRL_ALPHA": "0.2"}, k2=4)
    assert (s.retrieval.k1, s.retrieval.k2, s.learning.alpha) == (10, 4, 0.2)
    assert s.origin("k1") == f"file {config}"
    assert s.origin("alpha") == "environment MEMRL_ALPHA"
    assert s.origin("k2") == "argument"
    assert s.origin("q_weight") == "default"
    # MEMRL_CONFIG names the file when no argument does; an argument wins over it.
    assert load_settings(environ={"MEMRL_CONFIG": str(config)}).retrieval.k1 == 10
    other = tmp_path / "other.yaml"
    other.write_text("retrieval:\n  k1: 7\n")
    assert load_settings(other, environ={"MEMRL_CONFIG": str(config)}).retrieval.k1 == 7


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEMRL_K1": "0"}, "k1 (from environment MEMRL_K1)"),
        ({"MEMRL_Q_WEIGHT": "1.5"}, "q_weight"),
        ({"MEMRL_ALPHA": "fast"}, "alpha"),
        ({"MEMRL_EMBEDDER": "bert"}, "embedder"),
        ({"MEMRL_K1": "3", "MEMRL_K2": "4"}, "k2"),
        ({"MEMRL_REWARD_MIN": "1", "MEMRL_REWARD_MAX": "0"}, "reward_min"),
        ({"MEMRL_Q_INIT_SUCCESS": "2"}, "q_init_success"),
        ({"MEMRL_CONFIG": "/nonexistent/memrl.yaml"}, "/nonexistent/memrl.yaml: file not found"),
        ({"MEMRL_TOKENS": "not json"}, "MEMRL_TOKENS"),
    ],
)
def test_bad_values_are_named(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(named)):
        load_settings(environ=env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MEMRL_K_1": "5"}, "MEMRL_K_1: no such environment variable; did you mean MEMRL_K1?"),
        ({"MEMRL_QWEIGHT": "0.4"}, "did you mean MEMRL_Q_WEIGHT?"),
        ({"MEMRL_NAMESPCE": "team"}, "did you mean MEMRL_NAMESPACE?"),
    ],
)
def test_an_unknown_memrl_variable_is_an_error_naming_the_closest_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("?", r"\?")):
        load_settings(environ=env)


@pytest.mark.parametrize("variable", ["MEMRL_FOO", "MEMRL_X", "MEMRL_PROTOCOL"])
def test_an_unknown_variable_far_from_every_setting_gets_no_suggestion(variable: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={variable: "1"})
    assert str(refused.value) == f"{variable}: no such environment variable"


def test_every_json_setting_shows_an_example_the_setting_accepts() -> None:
    """A list or an object in the environment is JSON; a value that is not shows an example that loads as it is."""
    json_settings = {
        name
        for model in GROUPS.values()
        for name, field in model.model_fields.items()
        if get_origin(field.annotation) in (list, dict)
    }
    assert set(JSON_EXAMPLES) == json_settings
    for name, example in JSON_EXAMPLES.items():
        variable = "MEMRL_" + name.upper()
        with pytest.raises(SettingsError) as refused:
            load_settings(environ={variable: "not json"})
        assert str(refused.value) == f"{variable}: not JSON; give {name} as JSON, e.g. {example}"
        settings = load_settings(environ={variable: example})
        assert settings.value(name) and settings.origin(name) == f"environment {variable}"


def test_the_harness_variables_are_not_mistaken_for_settings() -> None:
    harness = {"MEMRL_LLM_BASE_URL": "http://127.0.0.1:1/v1", "MEMRL_LLM_MODEL": "m", "MEMRL_SHARED_DATA": "/data"}
    assert load_settings(environ=harness).retrieval.k1 == 5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("k1: 5\n", "k1 goes under retrieval:"),
        ("retrieval:\n  lamda: 0.5\n", "retrieval.lamda: no such setting in retrieval"),
        ("retrieval:\n  alpha: 0.5\n", "it belongs under learning:"),
        ("retreival:\n  k1: 5\n", "retreival: no such group; did you mean retrieval?"),
        ("[1, 2]\n", "must be a mapping of groups"),
        ("retrieval: [1]\n", "retrieval must be a mapping of settings"),
        ("retrieval: {k1: [\n", "not YAML"),
    ],
)
def test_a_bad_file_is_named_with_the_right_place(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text(content)
    with pytest.raises(SettingsError, match=message):
        load_settings(config, environ={})


def test_an_unknown_argument_is_refused() -> None:
    with pytest.raises(SettingsError, match="lamda: no such argument"):
        load_settings(environ={}, lamda=0.5)


def test_the_qdrant_ecosystem_names_work_and_memrl_wins(tmp_path: Path) -> None:
    env = {"QDRANT_URL": "http://qdrant.internal:6333", "QDRANT_API_KEY": "secret-key", "COLLECTION_NAME": "team"}
    s = load_settings(environ=env).storage
    assert s.qdrant_api_key is not None
    assert (s.qdrant_url, s.qdrant_api_key.get_secret_value(), s.collection) == (
        "http://qdrant.internal:6333",
        "secret-key",
        "team",
    )
    assert load_settings(environ={**env, "MEMRL_QDRANT_URL": "http://m:6333"}).storage.qdrant_url == "http://m:6333"
    config = tmp_path / "memrl.yaml"
    config.write_text("storage:\n  collection: from-yaml\n")
    assert load_settings(config, environ={"QDRANT_URL": "http://q:6333"}).storage.collection == "from-yaml"


@pytest.mark.slow  # a child process
def test_config_prints_every_value_with_its_source_and_masks_secrets(tmp_path: Path) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text("retrieval:\n  k1: 8\nstorage:\n  qdrant_api_key: very-secret-key\n")
    env = {"MEMRL_ALPHA": "0.25", "PATH": "/usr/bin:/bin"}
    shown = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "config", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "very-secret-key" not in shown
    printed = yaml.safe_load(shown)
    assert printed["retrieval"]["k1"] == 8 and printed["learning"]["alpha"] == 0.25
    assert printed["storage"]["qdrant_api_key"] == "***"
    lines = {line.split(":")[0].strip(): line for line in shown.splitlines() if line.startswith("  ")}
    assert lines["k1"].endswith(f"# file {config}")
    assert lines["alpha"].endswith("# environment MEMRL_ALPHA")
    assert lines["q_weight"].endswith("# default")
    refused = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "config"],
        capture_output=True,
        text=True,
        env={**env, "MEMRL_ALPHAA": "0.3"},
    )
    assert refused.returncode == 2
    assert "MEMRL_ALPHAA: no such environment variable; did you mean MEMRL_ALPHA?" in refused.stderr
