"""The environment variables the settings read (:mod:`memrl_mcp.settings`), known without loading the settings
(standard library only).

A session attached to the local server sends the server the variables its settings come from, and only those
(:func:`read_by_settings`): the server loads the session's settings from them, and the rest of its environment
(tokens, keys, whatever a shell holds) stays in the session's process. The settings themselves take these names
from here, so that the two can never disagree (``tests/test_attach.py`` loads the same settings from both).
"""

from __future__ import annotations

from collections.abc import Mapping

ENV_PREFIX = "MEMRL_"
ECOSYSTEM_VARIABLES = {
    "qdrant_url": "QDRANT_URL",
    "qdrant_api_key": "QDRANT_API_KEY",
    "collection": "COLLECTION_NAME",
    "project_dir": "CLAUDE_PROJECT_DIR",
}
"""Other programs' names for four settings: the Qdrant ecosystem's (the official Qdrant MCP server reads them), and
the project folder Claude Code gives every MCP server and hook it starts; ``MEMRL_*`` wins."""
OTHER_VARIABLES = frozenset(
    {
        "MEMRL_LLM_BASE_URL",
        "MEMRL_LLM_MODEL",
        "MEMRL_LLM_API_KEY",
        "MEMRL_MEMORY_TOKEN",
        "MEMRL_SHARED_DATA",
        "MEMRL_LLB_ROOTFS",
        "MEMRL_JUDGE_BASE_URL",
        "MEMRL_JUDGE_MODEL",
        "MEMRL_JUDGE_API_KEY",
        "MEMRL_PEER",
    }
)
"""``MEMRL_*`` variables that are not settings of the server: memrl-harness's own and the peer benchmark's, which the
environment of a harness run or a test holds when it starts a server."""


def read_by_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` the settings read: every ``MEMRL_*`` but :data:`OTHER_VARIABLES` (a misspelt
    one too, which the settings refuse by name), and the ecosystem's names (:data:`ECOSYSTEM_VARIABLES`). The
    default folders are not among them: the session resolves its store and runtime folder itself, and sends them."""
    ecosystem = set(ECOSYSTEM_VARIABLES.values())
    return {
        name: value
        for name, value in environ.items()
        if (name.startswith(ENV_PREFIX) and name not in OTHER_VARIABLES) or name in ecosystem
    }
