"""Every benchmark runs with the paper's memory constants (docs/algorithm.md's table), from the installed package."""

import os

import pytest

from memrl_harness.benchmarks import REGISTRY, memory_config
from memrl_mcp.settings import load_settings

# k1, k2, lambda, alpha, Q_init success / failure, reward min / max, epsilon: docs/algorithm.md, "The paper's
# constants per benchmark".
ALFWORLD = (5, 3, 0.5, 0.3, 0.0, 0.0, -1.0, 1.0, 0.0)
LLB = (10, 5, 0.5, 0.3, 0.5, 0.5, 0.0, 1.0, 0.01)
PAPER = {
    "alfworld": ALFWORLD,
    "controlled": ALFWORLD,  # built to run at ALFWorld's constants
    "controlled-steps": ALFWORLD,  # the same (its step memory runs at the step_* defaults)
    "chores": ALFWORLD,  # the coding chores, LLM-free like the controlled ones
    "hle": (5, 3, 0.5, 0.3, 1.0, 0.0, -1.0, 1.0, 0.0),
    "bigcodebench": (10, 5, 0.5, 0.3, 0.0, 0.0, -1.0, 1.0, 0.1),
    "llb-db": LLB,
    "llb-os": LLB,
}
FIELDS = ("k1", "k2", "q_weight", "alpha", "q_init_success", "q_init_failure", "reward_min", "reward_max", "epsilon")


def test_every_benchmark_has_its_constants() -> None:
    assert set(PAPER) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_effective_settings(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    for key in [key for key in os.environ if key.startswith("MEMRL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MEMRL_CONFIG", str(memory_config(name)))
    settings = load_settings()
    assert tuple(settings.value(field) for field in FIELDS) == PAPER[name]


def test_unknown_benchmark_is_named() -> None:
    with pytest.raises(ValueError, match="unknown benchmark 'alfword'"):
        memory_config("alfword")
