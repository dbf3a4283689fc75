"""One HTTP tool call against a raw asyncio service on a loopback port that sends exactly the
bytes a test gives it: the tool, its pool and its parsing as the gateway runs them."""

from __future__ import annotations

import asyncio

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.auth.principal import Principal
from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.tools.base import ToolContext
from gateway.tools.http import ServiceCalls, http_tool
from gateway.tools.http_request import RequestTemplate, ServiceEndpoint
from gateway.tools.http_transport import service_transport

SCHEMA = {"type": "object", "properties": {}}


async def call_answered_with(raw_answer: bytes, *, max_result_bytes: int = 1000, method: str = "GET",
                             mutates: bool = False) -> object:
    """What the tool's handler returns (or raises) for a service answering ``raw_answer``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw_answer)
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
                request=RequestTemplate.compile(method=method, path="/x", query=[], body=[], schema=SCHEMA),
                calls=calls, timeout_s=5, connect_timeout_s=1, max_result_bytes=max_result_bytes, mutates=mutates,
            )
            ctx = ToolContext(
                principal=Principal(tenant_id="acme", user_id="alice", roles=frozenset(), permissions=frozenset()),
                run_id="run", tool_call_id="call", request_id="req", db=None,
            )
            return await tool.handler(ctx, {})
    finally:
        server.close()
        await server.wait_closed()
