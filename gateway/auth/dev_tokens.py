"""Development tokens, signed with the configured HS256 secret. Production tokens come from your identity provider."""

from __future__ import annotations

import time
from collections.abc import Sequence

import jwt

from gateway.settings import Settings


def mint_token(
    settings: Settings, *, tenant_id: str, user_id: str, roles: Sequence[str], ttl_s: int = 3600
) -> str:
    if settings.jwt.secret is None:
        raise ValueError("GATEWAY_JWT_SECRET is not set")
    now = int(time.time())
    claims: dict[str, object] = {
        "sub": user_id,
        "tenant_id": tenant_id,
        "roles": list(roles),
        "iat": now,
        "nbf": now,
        "exp": now + ttl_s,
    }
    if settings.jwt.issuer:
        claims["iss"] = settings.jwt.issuer
    if settings.jwt.audience:
        claims["aud"] = settings.jwt.audience
    return jwt.encode(claims, settings.jwt.secret, algorithm="HS256")
