"""The tool registry: unique, well-named tools; a caller sees exactly what it may call."""

from __future__ import annotations

import json

import pytest

from gateway.demo import ADMIN, EDITOR, MEMBER
from gateway.tools.base import Tool
from gateway.tools.builtin import add, builtin_tools
from gateway.tools.registry import ToolRegistry

WRITE_TOOLS = {"create_article", "update_article", "delete_article"}


def names(registry: ToolRegistry, permissions: frozenset[str]) -> list[str]:
    return [t["function"]["name"] for t in json.loads(registry.definitions_json(permissions))["tools"]]


def test_a_tool_name_is_registered_once():
    with pytest.raises(ValueError):
        ToolRegistry([add, add])


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "x" * 65, "dot.ted"])
def test_a_tool_name_must_be_plain(name):
    tool = Tool(name=name, description="d", arguments=add.arguments, handler=add.handler, permission="p")
    with pytest.raises(ValueError):
        ToolRegistry([tool])


def test_a_member_sees_no_write_tools():
    visible = names(ToolRegistry(builtin_tools()), MEMBER)
    assert not WRITE_TOOLS & set(visible)
    assert {"add", "divide", "get_article", "get_current_time"} <= set(visible)


def test_an_editor_sees_the_write_tools():
    assert WRITE_TOOLS <= set(names(ToolRegistry(builtin_tools()), EDITOR))


def test_no_permissions_see_no_tools():
    assert names(ToolRegistry(builtin_tools()), frozenset()) == []


def test_tools_are_sorted_by_name_whatever_the_registration_order():
    assert names(ToolRegistry(reversed(builtin_tools())), ADMIN) == sorted(t.name for t in builtin_tools())


def test_definitions_are_identical_byte_for_byte_across_registries_and_calls():
    first = ToolRegistry(builtin_tools()).definitions_json(ADMIN)
    second = ToolRegistry(reversed(builtin_tools()))
    assert second.definitions_json(ADMIN) == first
    assert second.definitions_json(frozenset(ADMIN)) == first


def test_definitions_are_in_the_openai_tools_format():
    (definition,) = [
        t for t in json.loads(ToolRegistry(builtin_tools()).definitions_json(MEMBER))["tools"]
        if t["function"]["name"] == "add"
    ]
    assert definition["type"] == "function"
    assert set(definition["function"]) == {"name", "description", "parameters"}
    assert definition["function"]["parameters"]["additionalProperties"] is False


def test_registering_a_tool_later_is_seen_by_the_next_listing():
    registry = ToolRegistry([add])
    assert names(registry, MEMBER) == ["add"]
    registry.register(next(t for t in builtin_tools() if t.name == "multiply"))
    assert names(registry, MEMBER) == ["add", "multiply"]
