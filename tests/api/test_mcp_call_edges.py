"""Edges of the MCP endpoint's run and call identity: a token still accepted within the
clock-skew leeway after its ``exp``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.test_mcp_protocol import assert_rpc_error, call, envelope, modern_headers
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

