"""The gateway's session with an MCP server (the SDK's client over the guarded httpx2 client),
against a real SDK-built server on a loopback port: whose identity each request carries, and
what is read of an answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import jwt
import pytest
from mcp.shared.exceptions import MCPError

from gateway.mcp.upstream.config import parse_mcp_servers
from gateway.mcp.upstream.session import SessionUnavailable, UpstreamSession
from gateway.mcp.upstream.transport import CURRENT_CALL, CallScope, upstream_client
from tests.support.loopback import free_port
from tests.support.mcp_upstream import McpUpstream, UpstreamState

KEY = "a-key-only-this-test-uses-0123456789abcdef"


def bearer(sub: str) -> str:
    return "Bearer " + jwt.encode({"sub": sub}, KEY, algorithm="HS256")


@pytest.fixture(scope="module")
def upstream() -> Iterator[McpUpstream]:
    with McpUpstream(UpstreamState(jwks_url="http://127.0.0.1:9/unused")) as server:
        yield server


@asynccontextmanager
async def session_for(url: str) -> AsyncIterator[UpstreamSession]:
    (spec,) = parse_mcp_servers(
        {"notes": {"url": url, "include": ["big"], "tools": {"big": {"permission": "notes:read"}}}},
        where="test", default_timeout_s=5, default_max_result_bytes=1000, taken=set(),
    )
    client = upstream_client(gateway_authorization=lambda aud: bearer(f"the-gateway@{aud}"), timeout_s=5, connect_timeout_s=2,
                             max_connections=4, max_keepalive_connections=2)
    upstream_session = UpstreamSession(spec, client, open_timeout_s=5)
    try:
        yield upstream_session
    finally:
        await upstream_session.close()
        await client.aclose()


async def test_a_session_opened_during_a_call_is_opened_as_the_gateway(upstream: McpUpstream):
    seen = len(upstream.state.senders)
    async with session_for(upstream.url) as upstream_session:
        token = CURRENT_CALL.set(CallScope(authorization=bearer("alice"), response_limit=100_000))
        try:
            session = await upstream_session.session()  # opened by a call, in the call's context
            result = await session.call_tool("big", {"size": 3})
        finally:
            CURRENT_CALL.reset(token)
    assert result.structured_content == {"result": "xxx"}
    senders = upstream.state.senders[seen:]
    assert any(method == "tools/call" and sub == "alice" for method, sub, _ in senders)
    # The session's own messages are the gateway's (a tools/list the SDK makes to check the
    # call's result belongs to the call).
    assert {sub for method, sub, _ in senders if method.startswith(("initialize", "notifications/"))} == {
        "the-gateway@notes"}, senders


async def test_an_answer_past_the_call_cap_is_not_read(upstream: McpUpstream):
    scope = CallScope(authorization=bearer("alice"), response_limit=10_000)
    async with session_for(upstream.url) as upstream_session:
        token = CURRENT_CALL.set(scope)
        try:
            session = await upstream_session.session()
            with pytest.raises(MCPError):  # the SDK turns the cut answer into an error of the call
                await session.call_tool("big", {"size": 50_000})
        finally:
            CURRENT_CALL.reset(token)
    assert scope.oversized is True


async def test_a_server_that_is_not_there_is_unavailable_with_a_reason():
    async with session_for(f"http://127.0.0.1:{free_port()}/mcp") as upstream_session:
        with pytest.raises(SessionUnavailable) as caught:
            await upstream_session.list_tools()
    assert caught.value.reason == "connection refused or unreachable"
