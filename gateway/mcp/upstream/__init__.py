"""MCP servers behind the guard: the upstream tools the tools file includes, listed at start
and on every refresh, offered and called like any other tool (see docs/mcp-servers.md)."""
