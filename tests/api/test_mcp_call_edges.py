"""Edges of the MCP endpoint's run and call identity: a token still accepted within the
clock-skew leeway after its ``exp``; a call refused for permission before it could need an
approval."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.test_mcp_protocol import HEADERS, LEGACY, assert_rpc_error, call, envelope, modern_headers, post
from tests.support.tokens import auth_for


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"jwt_leeway_s": 30}


async def test_a_token_past_its_exp_within_the_leeway_gets_a_json_rpc_error(client):
    headers = {**modern_headers("tools/call", "add"), **auth_for("alice", ttl=-5)}
    response = await client.post(
        "/mcp", content=call(name="add", arguments={"a": 1, "b": 2}, _meta=envelope()), headers=headers
    )
    error = assert_rpc_error(response, -32600, 400, request_id=7)
    assert "expires_at" not in error["message"]


async def test_a_call_refused_for_permission_is_not_remembered_once_the_caller_may_make_it(client):
    as_member = {**HEADERS, **auth_for("alice", roles=["member"])}
    opened = await post(
        client,
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
        as_member,
    )
    session = opened.headers["mcp-session-id"]
    body = call(name="create_article", arguments={"title": "Later allowed", "body": "b"})
    refused = await post(client, body, {**as_member, "MCP-Protocol-Version": "2025-06-18", "Mcp-Session-Id": session})
    assert refused.json()["result"]["structuredContent"]["code"] == "PERMISSION_DENIED"
    as_editor = {**LEGACY, **auth_for("alice", roles=["editor"]), "Mcp-Session-Id": session}
    allowed = await post(client, body, as_editor)
    assert allowed.json()["result"]["structuredContent"]["code"] == "APPROVAL_REQUIRED"
