"""The memory's loop run by each agent's own hooks: one module per client's hook format over a client-neutral core
(:mod:`memrl_mcp.clients.core`). The standard library only: a hook is a fresh process per event."""
