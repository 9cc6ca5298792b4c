"""memrl-harness: runs benchmarks through an MCP client of memrl-mcp and reports learning curves.

The harness needs the ``harness`` extra (``pip install 'memrl-mcp[harness]'``); the ``memrl-harness`` command checks
for it first, so a server-only install says what to install instead of printing an ImportError's traceback.
"""

import sys
from importlib.util import find_spec

# Import name -> distribution of the harness extra's libraries (pyproject.toml).
HARNESS_EXTRA = {
    "openai": "openai",
    "matplotlib": "matplotlib",
    "tqdm": "tqdm",
    "pyseccomp": "pyseccomp",
    "pytest": "pytest",
}


def main() -> int:
    """The ``memrl-harness`` command: :func:`memrl_harness.cli.main` once the harness extra is installed."""
    missing = sorted(package for module, package in HARNESS_EXTRA.items() if find_spec(module) is None)
    if missing:
        print(
            f"memrl-harness: the harness extra is not installed (missing: {', '.join(missing)}): "
            "pip install 'memrl-mcp[harness]'",
            file=sys.stderr,
        )
        return 2
    from memrl_harness.cli import main as run

    return run()
