"""OAuth 2.0 Protected Resource Metadata (RFC 9728) for MCP clients: public, no token.

``/.well-known/oauth-protected-resource/mcp`` describes the MCP endpoint (the URL a 401 from
``/mcp`` names in ``WWW-Authenticate``); ``/.well-known/oauth-protected-resource`` the gateway
as a whole. Absolute URLs are made from the request's own scheme and host (run the server
with ``--proxy-headers`` behind a TLS-terminating proxy).
"""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Request, Response, get

from gateway.mcp.server.metadata import MCP_PATH, METADATA_PATH, ProtectedResourceMetadata, resource_metadata
from gateway.wiring import services_of


def _metadata(request: Request[Any, Any, Any], path: str) -> Response[ProtectedResourceMetadata]:
    settings = services_of(request.app).settings
    base = str(request.base_url).rstrip("/")
    return Response(
        content=resource_metadata(base + path, issuer=settings.jwt.issuer, jwks_url=settings.jwks.url),
        media_type=MediaType.JSON,
        # Built from the request's Host: a shared cache that does not key on it must not hand
        # one client's answer (naming its host) to another.
        headers={"Cache-Control": "private, max-age=300", "Vary": "Host"},
    )


@get(METADATA_PATH, include_in_schema=False, security=[])
async def gateway_resource_metadata(request: Request[Any, Any, Any]) -> Response[ProtectedResourceMetadata]:
    return _metadata(request, "")


@get(METADATA_PATH + MCP_PATH, include_in_schema=False, security=[])
async def mcp_resource_metadata(request: Request[Any, Any, Any]) -> Response[ProtectedResourceMetadata]:
    return _metadata(request, MCP_PATH)
