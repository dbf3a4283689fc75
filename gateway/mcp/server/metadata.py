"""OAuth 2.0 Protected Resource Metadata (RFC 9728) of the MCP endpoint."""

from __future__ import annotations

import msgspec

MCP_PATH = "/mcp"
METADATA_PATH = "/.well-known/oauth-protected-resource"


class ProtectedResourceMetadata(msgspec.Struct, omit_defaults=True):
    resource: str
    bearer_methods_supported: list[str]
    authorization_servers: list[str] | None = None
    resource_name: str | None = None


def metadata_url(base_url: str) -> str:
    """Where a client finds the metadata of ``<base_url>/mcp`` (the path-suffixed well-known URI)."""
    return base_url.rstrip("/") + METADATA_PATH + MCP_PATH


def bearer_challenge(base_url: str) -> str:
    """The ``WWW-Authenticate`` value of an unauthenticated MCP request."""
    return f'Bearer resource_metadata="{metadata_url(base_url)}"'


def resource_metadata(resource: str, *, issuer: str | None, jwks_url: str | None) -> ProtectedResourceMetadata:
    """The identity provider is named when tokens come from one (JWKS mode, with an issuer set)."""
    return ProtectedResourceMetadata(
        resource=resource,
        bearer_methods_supported=["header"],
        authorization_servers=[issuer] if issuer and jwks_url else None,
        resource_name="gateway",
    )
