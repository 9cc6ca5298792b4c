"""memrl-harness: runs benchmarks through an MCP client of memrl-mcp and reports learning curves."""
