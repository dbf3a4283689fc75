"""Tokens for tests, signed like production ones would be (PyJWT)."""

from __future__ import annotations

import time
from typing import Any

import jwt

TEST_SECRET = "test-secret-that-is-long-enough-for-hs256-0123456789"

DEMO_ROLES = {"alice": ["member"], "bob": ["editor"], "carol": ["admin"], "dave": ["approver"]}
DEFAULT_TTL_S = 8 * 3600
"""Tokens are often made when a test module is imported: they must outlive a slow run of the
whole suite, and stay within the gateway's default lifetime cap (a day)."""


def make_token(
    tenant: str = "acme",
    user: str = "alice",
    roles: list[str] | None = None,
    *,
    secret: str = TEST_SECRET,
    ttl: int = DEFAULT_TTL_S,
    extra: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    algorithm: str = "HS256",
    headers: dict[str, Any] | None = None,
) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": user,
        "tenant_id": tenant,
        "roles": roles if roles is not None else DEMO_ROLES.get(user, []),
        "iat": now,
        "exp": now + ttl,
    }
    claims.update(extra or {})
    for name in drop:
        claims.pop(name, None)
    return jwt.encode(claims, secret, algorithm=algorithm, headers=headers)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def auth_for(user: str = "alice", tenant: str = "acme", **kwargs: Any) -> dict[str, str]:
    return auth(make_token(tenant, user, **kwargs))


def _service_signing_key() -> str:
    from gateway.auth.service_tokens import generate_signing_key_pem

    return generate_signing_key_pem().decode()


SERVICE_SIGNING_KEY = _service_signing_key()
"""The EC P-256 key test gateways sign service tokens with (one per test session)."""
