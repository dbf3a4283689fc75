"""The tools a gateway process offers, and which of them a caller may see."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gateway.tools.base import Tool


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._definitions_cache: dict[frozenset[str], bytes] = {}
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

    def visible_to(self, permissions: frozenset[str]) -> list[Tool]:
        """The tools these permissions grant, sorted by name: a model is never offered what it may not call."""
        return [tool for tool in self if tool.permission in permissions]

    def definitions_json(self, permissions: frozenset[str]) -> bytes:
        """``{"tools": [...]}`` in the OpenAI format, identical byte for byte for equal permissions."""
        cached = self._definitions_cache.get(permissions)
        if cached is None:
            payload = {"tools": [tool.openai_definition() for tool in self.visible_to(permissions)]}
            cached = msgspec.json.encode(payload)
            if len(self._definitions_cache) > 1024:
                self._definitions_cache.clear()
            self._definitions_cache[permissions] = cached
        return cached
