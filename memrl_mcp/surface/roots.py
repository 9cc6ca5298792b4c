"""Per-project memory without configuration: a default namespace derived from the client's MCP roots.

A client that offers roots (Claude Code, VS Code and others list the project folder they were opened in) gets,
when neither the call, its token nor the ``namespace`` setting names a namespace, its project's, derived from its
first root (:func:`~memrl_mcp.projects.project_of`: the git repository the folder is in, for a client of this
machine; a root over HTTP may name another machine's folder, taken as it is): a readable slug of the folder name
and a short hash of the full URI (``memrl-mcp-3fa9c2d1``), so one server attached to several projects keeps their
memories apart, and two folders of the same name do not meet. A client of the 2026-07-28 protocol cannot be asked
for its roots: the ``project_dir`` setting names its project folder instead (Claude Code gives it to every server it
starts; ``memrl-mcp --project DIR`` for any other client).

This only ever picks the *default*: the namespaces a token may use are unchanged, and the derived one is checked
against them like any other.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp.types import ListRootsRequest, ListRootsResult

from memrl_mcp.projects import Project, project_of

log = logging.getLogger(__name__)

ROOTS_TIMEOUT_SECONDS = 5.0  # a client that never answers roots/list must not hold every call up
STATE_KEY = "memrl_project"


async def roots_project(ctx: Context[Any, Any], on_this_machine: bool) -> Project | None:
    """The project of the client's first root, asked once per connection (None: it offers no roots, cannot be
    asked on this transport, or did not answer in time). A client that changes its roots gets the new project
    on its next connection. ``on_this_machine``: the root names a folder of this machine, whose repository counts
    (:func:`~memrl_mcp.projects.project_of`).

    The answer is kept in the SDK's per-connection state (``Connection.state``, reached through the session's
    private ``_connection``: the session object itself is new at every request)."""
    session = ctx.session
    connection = getattr(session, "_connection", None)
    state = getattr(connection, "state", None)
    if state is not None and STATE_KEY in state:
        known: Project | None = state[STATE_KEY]
        return known
    project = None
    capabilities = ctx.client_capabilities
    offered = capabilities is not None and capabilities.roots is not None
    # A call answered over its own stream (stdio, SSE) asks on it; one answered with plain JSON (this server's
    # streamable HTTP) asks on the connection's standalone stream. The 2026-07-28 protocol has neither.
    channel: Any = session if session.can_send_request else connection  # both send requests; the SDK types neither
    if offered and (channel is session or getattr(connection, "has_standalone_channel", False)):
        try:
            with anyio.fail_after(ROOTS_TIMEOUT_SECONDS):
                result = await channel.send_request(ListRootsRequest(), result_type=ListRootsResult)
            if result.roots:
                project = project_of(str(result.roots[0].uri), on_this_machine)
        except Exception as error:  # whatever the client answers (or not), the default stays as it was
            log.debug("roots/list failed (%s): the default namespace is used", type(error).__name__)
    if state is not None:
        state[STATE_KEY] = project
    return project
