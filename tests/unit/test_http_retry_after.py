"""A business service's ``Retry-After`` reaches the model only as a short count of seconds:
whatever else a hostile service sends there still makes the call a ``RATE_LIMITED`` refusal."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.auth.principal import Principal
from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.errors import ERRORS, ErrorCode, ToolError
from gateway.tools.base import ToolContext
from gateway.tools.http import ServiceCalls, http_tool
from gateway.tools.http_request import RequestTemplate, ServiceEndpoint
from gateway.tools.http_transport import service_transport

SCHEMA = {"type": "object", "properties": {}}
REFUSED = ERRORS[ErrorCode.RATE_LIMITED].message


async def refusal_for(retry_after: bytes, *, status: bytes = b"429 Too Many", encoding: bytes = b"") -> ToolError:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        extra = b"content-encoding: " + encoding + b"\r\n" if encoding else b""
        writer.write(b"HTTP/1.1 " + status + b"\r\nretry-after: " + retry_after + b"\r\n" + extra
                     + b"content-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    calls = ServiceCalls(ServiceTokenSigner(ec.generate_private_key(ec.SECP256R1()), issuer="gw", ttl_s=60),
                         max_calls_per_tenant=25)
    transport = service_transport(limits=httpx.Limits(max_connections=2, max_keepalive_connections=2))
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            calls.attach(client, transport)
            tool = http_tool(
                name="t", description="d", schema=SCHEMA, permission="p",
                service=ServiceEndpoint.parse("svc", url),
                request=RequestTemplate.compile(method="GET", path="/x", query=[], body=[], schema=SCHEMA),
                calls=calls, timeout_s=5, connect_timeout_s=1, max_result_bytes=1000,
            )
            ctx = ToolContext(
                principal=Principal(tenant_id="acme", user_id="alice", roles=frozenset(), permissions=frozenset()),
                run_id="run", tool_call_id="call", request_id="req", db=None,
            )
            with pytest.raises(ToolError) as refused:
                await tool.handler(ctx, {})
    finally:
        server.close()
        await server.wait_closed()
    return refused.value


@pytest.mark.parametrize("retry_after", [b"\xb2", b"\xb9\xb3", b"1" * 5000, b"9" * 4000, b"-1", b"1.5", b""])
async def test_a_retry_after_that_is_not_a_short_count_of_seconds_is_left_out(retry_after: bytes):
    refusal = await refusal_for(retry_after)
    assert refusal.code is ErrorCode.RATE_LIMITED
    assert refusal.message == REFUSED


async def test_a_short_count_of_seconds_is_passed_on():
    refusal = await refusal_for(b"120")
    assert (refusal.code, refusal.message) == (ErrorCode.RATE_LIMITED, f"{REFUSED} Retry after 120 s.")


@pytest.mark.parametrize(("status", "code", "retryable"), [
    (b"429 Too Many", ErrorCode.RATE_LIMITED, True),
    (b"503 Unavailable", ErrorCode.TOOL_EXECUTION_FAILED, True),
    (b"404 Not Found", ErrorCode.NOT_FOUND, False),
])
async def test_a_refusal_with_a_compressed_body_keeps_the_meaning_of_its_status(status, code, retryable):
    """A review's find: a compressed error body made every refusal a non-retryable
    TOOL_EXECUTION_FAILED, losing a 503's retry and a 429's Retry-After. The body stays unread."""
    refusal = await refusal_for(b"30", status=status, encoding=b"gzip")
    assert refusal.code is code
    assert (ERRORS[code].retryable if refusal.retryable is None else refusal.retryable) is retryable
    if code is ErrorCode.RATE_LIMITED:
        assert refusal.message == f"{REFUSED} Retry after 30 s."
