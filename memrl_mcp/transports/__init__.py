"""How clients reach the MCP surface: stdio on the event loop, streamable HTTP and SSE with their tokens, quotas and
host checks, and beside an HTTP server's MCP endpoint the operators' routes and the ``/ui`` inspector."""
