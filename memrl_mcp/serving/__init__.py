"""Serving: the MCP tools, resources and prompt over the memory service, the HTTP transports with their tokens and
quotas, project namespaces from MCP roots, logs and metrics, and the ``/ui`` inspector."""
