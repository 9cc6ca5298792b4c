"""The benchmarks the harness knows, imported only when asked for (each brings its own dependencies)."""

from __future__ import annotations

import importlib
from typing import Any

from harness.benchmarks.base import Benchmark

REGISTRY = {
    "controlled": "harness.benchmarks.controlled:ControlledBenchmark",
    "bigcodebench": "harness.benchmarks.bigcodebench:BigCodeBenchmark",
    "hle": "harness.benchmarks.hle:HLEBenchmark",
    "alfworld": "harness.benchmarks.alfworld:AlfworldBenchmark",
    "llb-db": "harness.benchmarks.llb_db:LLBDBBenchmark",
    "llb-os": "harness.benchmarks.llb_os:LLBOSBenchmark",
}


def load_benchmark(name: str, **options: Any) -> Benchmark:
    """The benchmark called ``name``, built with its options (data paths and the like)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(REGISTRY))}")
    module_name, class_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)(**options)
