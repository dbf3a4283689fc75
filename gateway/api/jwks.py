"""The gateway's public keys (JWKS): business services verify the tokens it signs for them."""

from __future__ import annotations

from litestar import MediaType, Response, get
from litestar.di import NamedDependency

from gateway.api.schemas import Jwks

JWKS_PATH = "/.well-known/jwks.json"


@get(JWKS_PATH, tags=["identity"], summary="The gateway's public signing keys", security=[])
async def public_keys(service_jwks: NamedDependency[Jwks]) -> Response[Jwks]:
    """The keys that verify the tokens the gateway sends to business services (no authentication)."""
    return Response(
        content=service_jwks,
        media_type=MediaType.JSON,
        headers={"Cache-Control": "public, max-age=300"},
    )
