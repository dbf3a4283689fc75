"""GET /v1/tools: the caller's granted tools, in the OpenAI format, sorted, stable byte for byte."""

from __future__ import annotations

from tests.support.calls import tool_names
from tests.support.tokens import auth_for

WRITE_TOOLS = {"create_article", "update_article", "delete_article"}
ALL_TOOLS = [
    "add", "create_article", "delete_article", "divide", "get_article", "get_current_time", "multiply",
    "search_articles", "update_article",
]


async def test_a_member_sees_only_granted_tools_and_never_write_tools(client):
    names = await tool_names(client, "alice")
    assert names == ["add", "divide", "get_article", "get_current_time", "multiply", "search_articles"]
    assert not WRITE_TOOLS & set(names)


async def test_an_editor_also_sees_the_write_tools(client):
    assert await tool_names(client, "bob") == ALL_TOOLS


async def test_a_role_unknown_to_the_tenant_grants_nothing(client):
    assert await tool_names(client, "mallory", roles=["superuser"]) == []


async def test_tools_are_sorted_by_name(client):
    names = await tool_names(client, "carol")
    assert names == sorted(names)


async def test_the_listing_is_identical_byte_for_byte_between_calls(client):
    first = await client.get("/v1/tools", headers=auth_for("bob"))
    second = await client.get("/v1/tools", headers=auth_for("bob", ttl=900))
    assert first.content == second.content
    assert first.headers["content-type"].startswith("application/json")


async def test_every_schema_forbids_additional_properties(client):
    tools = (await client.get("/v1/tools", headers=auth_for("carol"))).json()["tools"]
    assert len(tools) == len(ALL_TOOLS)
    for tool in tools:
        assert tool["type"] == "function"
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object" and parameters["additionalProperties"] is False
        assert set(parameters["required"]) <= set(parameters["properties"])
        assert tool["function"]["description"]


async def test_the_same_roles_see_the_same_tools_in_another_tenant(client):
    assert await tool_names(client, "alice", tenant="globex") == await tool_names(client, "alice")
