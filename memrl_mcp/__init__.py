"""memrl-mcp: an MCP server whose episodic memory learns from rewards which past experiences help (MemRL)."""

__version__ = "0.1.0"
