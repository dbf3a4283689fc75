"""The tools a gateway process offers, and which of them a caller may see."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gateway.db.policies import NO_POLICIES, TenantPolicies
from gateway.execution.policy import is_visible
from gateway.tools.base import Tool


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._definitions_cache: dict[tuple[str, ...], bytes] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        if not tool.name or len(tool.name) > 64 or not tool.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"tool name {tool.name!r} must be 1-64 letters, digits, '_' or '-'")
        self._tools[tool.name] = tool
        self._definitions_cache.clear()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self._tools.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._tools)

    def visible_to(
        self,
        permissions: frozenset[str],
        *,
        roles: frozenset[str] = frozenset(),
        policies: TenantPolicies = NO_POLICIES,
    ) -> list[Tool]:
        """The tools these permissions grant and the tenant's policies let these roles use,
        sorted by name: a model is never offered what it may not call."""
        return [
            tool
            for tool in self
            if is_visible(tool, policies.for_tool(tool.name), permissions=permissions, roles=roles)
        ]

    def definitions_json(
        self,
        permissions: frozenset[str],
        *,
        roles: frozenset[str] = frozenset(),
        policies: TenantPolicies = NO_POLICIES,
    ) -> bytes:
        """``{"tools": [...]}`` in the OpenAI format, identical byte for byte for the same visible tools."""
        visible = self.visible_to(permissions, roles=roles, policies=policies)
        key = tuple(tool.name for tool in visible)
        cached = self._definitions_cache.get(key)
        if cached is None:
            cached = msgspec.json.encode({"tools": [tool.openai_definition() for tool in visible]})
            if len(self._definitions_cache) > 1024:
                self._definitions_cache.clear()
            self._definitions_cache[key] = cached
        return cached
