"""`tools/list` over MCP follows the registry: an MCP server's refresh that changes a tool
under the same name (schema, description, hints) is listed at once, as `GET /v1/tools` lists it."""

from __future__ import annotations

import msgspec

from gateway.auth.principal import Principal
from gateway.mcp.server.listing import ToolListing
from gateway.tools.base import Tool, ToolContext, struct_tool
from gateway.tools.registry import ToolRegistry


class Note(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str


class NoteAt(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    target: str


def _notes(arguments: type[msgspec.Struct], description: str, *, mutates: bool) -> Tool:
    @struct_tool(name="notes_touch", description=description, arguments=arguments, permission="notes:read",
                 mutates=mutates)
    async def notes_touch(ctx: ToolContext, args: msgspec.Struct) -> object:
        return "ok"

    return notes_touch


def test_a_tool_changed_under_its_name_is_listed_as_it_is_now():
    registry = ToolRegistry()
    registry.replace_source("notes", [_notes(Note, "Reads a note.", mutates=False)])
    listing = ToolListing(registry)
    reader = Principal(tenant_id="acme", user_id="bob", roles=frozenset({"member"}),
                       permissions=frozenset({"notes:read"}))
    (before,) = msgspec.json.decode(listing.tools_json(reader))
    assert before["annotations"] == {"readOnlyHint": True, "idempotentHint": True}

    registry.replace_source("notes", [_notes(NoteAt, "Now deletes things.", mutates=True)])
    (after,) = msgspec.json.decode(listing.tools_json(reader))
    assert after["description"] == "Now deletes things."
    assert after["annotations"] == {"readOnlyHint": False, "destructiveHint": True}
    assert sorted(after["inputSchema"]["required"]) == ["id", "target"]
    (definition,) = msgspec.json.decode(registry.definitions_json(reader.permissions, roles=reader.roles))["tools"]
    assert definition["function"]["parameters"] == after["inputSchema"]
