"""The memory's loop run by each agent's own hooks: one module per client's hook format over a client-neutral core
(:mod:`memrl_mcp.clients.core`). The standard library only: a hook is a fresh process per event.

:data:`CLIENTS` names each client's module (imported only when its hook runs); :func:`client_named` says which
client sent an event when the hook's command does not (``--client``): agents that run Claude Code's plugins run its
hook commands as they are, and tell themselves apart by their environment."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # not at run time: every module of the package imports the core, which imports this package
    from memrl_mcp.clients.core import Client

CLIENTS = {
    "claude-code": "memrl_mcp.clients.claude_code",
    "codex": "memrl_mcp.clients.codex",
    "copilot": "memrl_mcp.clients.copilot",
    "gemini": "memrl_mcp.clients.gemini",  # its hooks name it (integrations/gemini-cli/hooks/hooks.json)
}
"""Each client's name, as ``memrl-mcp hook --client`` takes it, and the module of its hook format (its ``CLIENT``)."""
SIGNS: tuple[tuple[str, str], ...] = (("COPILOT_PLUGIN_ROOT", "copilot"), ("PLUGIN_DATA", "codex"))
"""An environment variable each agent gives its hooks, and the client it names, first match wins; none: Claude
Code. Each is one the agent gives its plugin's hooks alone: what it gives its shell commands (``COPILOT_CLI``,
``CODEX_HOME``) reaches another agent started from them, whose hooks are that agent's."""


def client_named(name: str | None, environ: Mapping[str, str]) -> Client:
    """The hook format of client ``name``, else of the agent the environment names (:data:`SIGNS`), else Claude
    Code's; ValueError naming the clients for an unknown name."""
    chosen = name or next((client for variable, client in SIGNS if environ.get(variable)), "claude-code")
    if chosen not in CLIENTS:
        raise ValueError(f"--client: no client {chosen!r}: one of {', '.join(CLIENTS)}")
    return cast("Client", importlib.import_module(CLIENTS[chosen]).CLIENT)
