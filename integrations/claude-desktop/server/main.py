"""The bundle's entry point: memrl-mcp over stdio, started by Claude Desktop through ``uv run`` (manifest.json).

Claude Desktop passes each user setting to the server as a ``MEMRL_*`` variable, an empty string when the user left
it empty. For the server an empty value is a value (an empty ``MEMRL_DATA_DIR`` would be the current folder, the
bundle's own, which an update replaces), so an empty setting is taken out here and the server's default applies.
"""

import os
import sys

if __name__ == "__main__":
    for name in [name for name, value in os.environ.items() if name.startswith("MEMRL_") and not value.strip()]:
        del os.environ[name]
    from memrl_mcp.cli import main

    sys.exit(main([]))
