"""The MCP surface: what an agent sees of the memory (the tools of a profile, the resources, the prompt, the
instructions), what its model reads of each result, and the questions the server asks its client (the user's
reward, the client model's experience). Served by :mod:`memrl_mcp.transports`."""
