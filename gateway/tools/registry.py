"""The tools a gateway process offers, and which of them a caller may see.

Most tools are registered once, at start. The tools of an MCP server behind the guard come
and go with its tool list: ``replace_source`` swaps them in one step (a new mapping replaces
the old one, never edited in place), so a reader sees the tools before or after a refresh,
never a mix; a refresh that changes nothing keeps everything, ``GET /v1/tools`` byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from gateway.db.policies import NO_POLICIES, TenantPolicies
from gateway.execution.policy import is_visible
from gateway.tools.base import Tool


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._definitions_cache: dict[tuple[str, ...], bytes] = {}
        self._sources: dict[str, frozenset[str]] = {}
        self.generation = 0
        """Moves on with every change of a tool: what is derived from the tools keys on it."""
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        _check_name(tool.name)
        self._tools[tool.name] = tool
        self._definitions_cache.clear()
        self.generation += 1

    def replace_source(self, source: str, tools: Sequence[Tool], *, label: str | None = None) -> list[str]:
        """Make ``tools`` the tools of ``source`` (an MCP server), in place of those it had.

        A tool whose name another source or a registered tool holds is left out; the names
        left out are returned. When the tools are the same as before (same definitions and
        limits), nothing changes."""
        current = self._tools
        owned = self._sources.get(source, frozenset())
        others = {name: tool for name, tool in current.items() if name not in owned}
        refused: list[str] = []
        mine: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in others or tool.name in mine:
                refused.append(tool.name)
                continue
            _check_name(tool.name)
            mine[tool.name] = tool
        if mine.keys() == owned and all(_same(current[name], tool) for name, tool in mine.items()):
            return refused
        self._sources[source] = frozenset(mine)
        self._definitions_cache = {}
        self._tools = {**others, **mine}
        self.generation += 1
        return refused

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


def _check_name(name: str) -> None:
    if not name or len(name) > 64 or not name.isascii() or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")


def _same(old: Tool, new: Tool) -> bool:
    """Whether a caller could tell ``new`` from ``old``: what the model sees and how calls run."""
    return (
        old.openai_definition() == new.openai_definition()
        and (old.permission, old.mutates, old.timeout_s, old.max_result_bytes, old.sensitive_fields)
        == (new.permission, new.mutates, new.timeout_s, new.max_result_bytes, new.sensitive_fields)
    )
