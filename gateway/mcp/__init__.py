"""MCP: the gateway as an MCP server (server/) and MCP servers behind the guard (upstream/)."""
