"""The memory: the service (:mod:`~memrl_mcp.memory.service`) over two learners, MemRL's episode memory and
Rememberer's step memory, with their pure learning rules (:mod:`~memrl_mcp.memory.algorithm`), the stored records,
the optimistic ledger that applies every reward once, listing, and backups."""
