"""``tools/list``: the tools the caller may call, as MCP ``Tool`` objects.

The same tools and the same strict argument schemas as ``GET /v1/tools`` (one visibility
rule: ``ToolRegistry.visible_to``), sorted by name and identical byte for byte between
calls. Annotations come from what the gateway knows of a tool: ``readOnlyHint`` when it
changes nothing, ``destructiveHint`` when it does; ``idempotentHint`` only where that is
known (a read-only tool).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.auth.principal import Principal
from gateway.tools.base import Tool
from gateway.tools.registry import ToolRegistry


def mcp_tool(tool: Tool) -> dict[str, Any]:
    annotations: dict[str, Any] = {"readOnlyHint": not tool.mutates}
    if tool.mutates:
        annotations["destructiveHint"] = True
    else:
        annotations["idempotentHint"] = True
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.arguments.json_schema(),
        "annotations": annotations,
    }


class ToolListing:
    """The encoded ``tools`` array of each set of visible tools, made once."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._registry = registry
        self._cache: dict[tuple[int, tuple[str, ...]], msgspec.Raw] = {}

    def tools_json(self, principal: Principal) -> msgspec.Raw:
        visible = self._registry.visible_to(
            principal.permissions, roles=principal.roles, policies=principal.tool_policies
        )
        # The registry's generation: an MCP server's refresh may change a tool's schema,
        # description or hints under the same name.
        key = (self._registry.generation, tuple(tool.name for tool in visible))
        cached = self._cache.get(key)
        if cached is None:
            cached = msgspec.Raw(msgspec.json.encode([mcp_tool(tool) for tool in visible]))
            if len(self._cache) > 1024:
                self._cache.clear()
            self._cache[key] = cached
        return cached
