"""The gateway as an MCP server: the streamable-HTTP exchange at ``/mcp``.

One JSON-RPC request in, one JSON response out, on the gateway's own Litestar route
(``gateway.api.mcp``), so authentication, request ids, limits, metrics and the error
envelope are the REST API's. Both eras of the protocol are served:

- 2026-07-28 (``server/discover``, no sessions): each request carries its envelope in
  ``params._meta`` and the ``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` headers;
  a caller's calls count against its default run for the token (``runs.py``).
- earlier revisions (``initialize`` + ``Mcp-Session-Id``): the session id is the id of
  the run created at ``initialize``, so any gateway process serves any session.

``protocol.py`` reads the envelope (hostile input), ``handler.py`` answers the methods,
``results.py`` maps the executor's messages to ``CallToolResult``s, ``listing.py``
renders ``tools/list``.
"""
