"""The benchmarks the harness knows, imported only when asked for (each brings its own dependencies), their options,
and the memory constants each one runs with."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from memrl_harness.benchmarks.base import Benchmark
from memrl_harness.benchmarks.options import BenchmarkOptions


@dataclass(frozen=True)
class Entry:
    """A benchmark class (``module:Class``, built from its options as keyword arguments, with its options model as
    ``Options``) and the packaged memrl-mcp settings with the paper's constants for it
    (``memrl_harness/configs/<memory_config>.yaml``; LLB's OS and DB tasks share one)."""

    target: str
    memory_config: str


REGISTRY = {
    "controlled": Entry("memrl_harness.benchmarks.controlled:ControlledBenchmark", "controlled"),
    "controlled-steps": Entry("memrl_harness.benchmarks.controlled_steps:ControlledStepsBenchmark", "controlled"),
    "chores": Entry("memrl_harness.benchmarks.chores:ChoresBenchmark", "controlled"),
    "bigcodebench": Entry("memrl_harness.benchmarks.bigcodebench:BigCodeBenchmark", "bigcodebench"),
    "hle": Entry("memrl_harness.benchmarks.hle:HLEBenchmark", "hle"),
    "alfworld": Entry("memrl_harness.benchmarks.alfworld:AlfworldBenchmark", "alfworld"),
    "llb-db": Entry("memrl_harness.benchmarks.llb_db:LLBDBBenchmark", "llb"),
    "llb-os": Entry("memrl_harness.benchmarks.llb_os:LLBOSBenchmark", "llb"),
}


def _entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def _class(name: str) -> Any:
    module_name, class_name = _entry(name).target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def load_benchmark(name: str, **options: Any) -> Benchmark:
    """The benchmark called ``name``, built with its options (text or typed; an OptionError refuses a bad one)."""
    return _class(name)(**options)


def options_model(name: str) -> type[BenchmarkOptions]:
    """The options of benchmark ``name``: their types, defaults, bounds and descriptions."""
    return _class(name).Options


def memory_config(name: str) -> Path:
    """The packaged settings file of benchmark ``name``; a missing one is an error, never the server's defaults
    (which are ALFWorld's constants, wrong for the other benchmarks)."""
    path = Path(str(resources.files("memrl_harness") / "configs" / f"{_entry(name).memory_config}.yaml"))
    if not path.is_file():
        raise ValueError(f"benchmark {name}: its memory settings {path} are missing from the installation")
    return path
