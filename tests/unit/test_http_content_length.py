"""A business service's `Content-Length` is only reported, never trusted to be a short number:
thousands of leading zeros (which the parser accepts) or digits past what `int` takes leave a
truncated answer truncated, not a call that failed after the service acted."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.auth.principal import Principal
from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.tools.base import PartialResult, ToolContext
from gateway.tools.http import ServiceCalls, http_tool
from gateway.tools.http_request import RequestTemplate, ServiceEndpoint
from gateway.tools.http_transport import service_transport

SCHEMA = {"type": "object", "properties": {}}
BODY = b"x" * 20_000
LIMIT = 1000


async def answer_to(content_length: bytes) -> object:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: " + content_length
                     + b"\r\n\r\n" + BODY)
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
                request=RequestTemplate.compile(method="POST", path="/pay", query=[], body=[], schema=SCHEMA),
                calls=calls, timeout_s=5, connect_timeout_s=1, max_result_bytes=LIMIT, mutates=True,
            )
            ctx = ToolContext(
                principal=Principal(tenant_id="acme", user_id="alice", roles=frozenset(), permissions=frozenset()),
                run_id="run", tool_call_id="call", request_id="req", db=None,
            )
            return await tool.handler(ctx, {})
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("content_length", "reported"),
    [(b"20000", 20_000), (b"0" * 4400 + b"20000", 20_000), (b"0" * 20 + b"20000", 20_000)],
    ids=["plain", "4400-leading-zeros", "20-leading-zeros"],
)
async def test_an_answer_past_the_limit_is_cut_with_its_length_however_many_zeros_lead_it(content_length, reported):
    answer = await answer_to(content_length)
    assert isinstance(answer, PartialResult)
    assert answer.kept == BODY[:LIMIT] and answer.original_bytes == reported
