"""One exception tree for the package: catch :class:`MemrlError` to catch anything memrl-mcp raises on purpose."""


class MemrlError(Exception):
    """Base of every error memrl-mcp raises on purpose (a refused request, a bad setting, a locked store...)."""


class MemoryRequestError(MemrlError):
    """A request was refused (bad input, unknown or spent recall); nothing was changed. The message starts
    with the field it is about."""
