"""Tenancy: the namespaces a caller may use. Every service call that serves a caller takes one, required,
so that a new tool cannot forget its caller's tenant and see every tenant's memories by default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Access:
    """The namespaces a caller may use (from its bearer token), and the one used when a call names none.

    ``namespaces=None`` is every namespace: a local caller (stdio, an in-process client, a server without
    tokens, the operator's CLI). Memories and recalls outside a caller's namespaces are reported as unknown,
    never as forbidden, so their existence does not leak. ``client`` names the token, for the logs (None: a
    local caller); ``holder`` says who the namespaces are granted to, in a refusal. ``also_recalled``: the namespaces
    a recall (or a search) of the default namespace searches too, those it may use: a project's earlier namespace
    (:class:`~memrl_mcp.projects.Project`), whose memories are the same project's. ``client_name``: the name the MCP
    client gave itself (:func:`~memrl_mcp.validation.client_name`), kept with the experiences it writes."""

    namespaces: frozenset[str] | None = None
    default: str | None = None
    client: str | None = None
    holder: str = "this token"
    also_recalled: tuple[str, ...] = ()
    client_name: str | None = None

    def allows(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


EVERYTHING = Access()
"""Every namespace: for local callers only (see :class:`Access`)."""
