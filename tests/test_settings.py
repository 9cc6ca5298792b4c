"""Settings: defaults from the paper, YAML file, environment precedence, errors that name the setting."""

import re
from pathlib import Path

import pytest

from memrl_mcp.settings import Settings, SettingsError, load_settings

DEFAULT_YAML = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def test_paper_defaults() -> None:
    s = load_settings()
    assert (s.k1, s.k2, s.q_weight, s.alpha, s.q_init_success, s.q_init_failure) == (5, 3, 0.5, 0.3, 0.0, 0.0)
    assert (s.reward_min, s.reward_max, s.epsilon, s.embedder, s.embedded_engine) == (-1.0, 1.0, 0.0, "minilm", "edge")


def test_the_documented_yaml_is_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMRL_CONFIG", str(DEFAULT_YAML))
    from_file = load_settings()
    monkeypatch.delenv("MEMRL_CONFIG")
    assert from_file == load_settings()
    # ... and it lists every setting (data_dir as a comment: its default is the platform's folder).
    listed = set(re.findall(r"^#? ?([a-z_0-9]+):", DEFAULT_YAML.read_text(), re.MULTILINE))
    assert listed == set(Settings.model_fields)


def test_environment_wins_over_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text("k1: 10\nk2: 5\nalpha: 0.1\n")
    monkeypatch.setenv("MEMRL_CONFIG", str(config))
    monkeypatch.setenv("MEMRL_ALPHA", "0.2")
    s = load_settings()
    assert (s.k1, s.k2, s.alpha) == (10, 5, 0.2)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEMRL_K1": "0"}, "k1"),
        ({"MEMRL_Q_WEIGHT": "1.5"}, "q_weight"),
        ({"MEMRL_ALPHA": "fast"}, "alpha"),
        ({"MEMRL_EMBEDDER": "bert"}, "embedder"),
        ({"MEMRL_K1": "3", "MEMRL_K2": "4"}, "k2"),
        ({"MEMRL_REWARD_MIN": "1", "MEMRL_REWARD_MAX": "0"}, "reward_min"),
        ({"MEMRL_Q_INIT_SUCCESS": "2"}, "q_init_success"),
        ({"MEMRL_CONFIG": "/nonexistent/memrl.yaml"}, "MEMRL_CONFIG"),
    ],
)
def test_bad_values_are_named(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=named):
        load_settings()


def test_unknown_key_in_the_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "memrl.yaml"
    config.write_text("k1: 5\nlamda: 0.5\n")
    monkeypatch.setenv("MEMRL_CONFIG", str(config))
    with pytest.raises(SettingsError, match="lamda"):
        load_settings()


def test_the_qdrant_ecosystem_names_work_and_memrl_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QDRANT_URL", "http://qdrant.internal:6333")
    monkeypatch.setenv("QDRANT_API_KEY", "secret-key")
    monkeypatch.setenv("COLLECTION_NAME", "team")
    s = load_settings()
    assert (s.qdrant_url, s.qdrant_api_key.get_secret_value(), s.collection) == (
        "http://qdrant.internal:6333",
        "secret-key",
        "team",
    )
    monkeypatch.setenv("MEMRL_QDRANT_URL", "http://memrl.internal:6333")
    assert load_settings().qdrant_url == "http://memrl.internal:6333"
    config = tmp_path / "memrl.yaml"
    config.write_text("collection: from-yaml\n")
    monkeypatch.delenv("COLLECTION_NAME")
    monkeypatch.setenv("MEMRL_CONFIG", str(config))
    assert load_settings().collection == "from-yaml"
