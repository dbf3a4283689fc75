"""Anchors: a tenant's chain head, signed with the gateway's service key, kept outside the database.

The chain alone proves that rows agree with each other, not that nobody rewrote them: a
person with write access to the database can change a sealed row and recompute every later
hash and the stored head, and ``audit verify`` still passes. An anchor closes that gap. It
is a JWS (compact JWT) signed with the key of ``GATEWAY_SERVICE_SIGNING_KEY[_FILE]``, the
one whose public half the gateway serves at ``/.well-known/jwks.json``::

    header  {"alg": "ES256" | "RS256", "kid": <JWKS key id>, "typ": "gateway-audit-anchor+jwt"}
    claims  {"iss": GATEWAY_SERVICE_TOKEN_ISSUER, "aud": "gateway-audit-anchor",
             "tenant_id": T, "chain_seq": N, "chain_hash": H, "iat": <unix time>,
             "start_seq": S, "start_hash": SH}

``audit verify --anchor`` checks its signature with the gateway's key set, and that the row
at position ``N`` of the tenant's chain still has chain hash ``H`` while the chain verifies up
to it: since every chain hash covers all rows before it, no row up to ``N`` changed, moved,
appeared or disappeared after the anchor was taken, unless the signing key was also stolen.
``start_seq`` and ``start_hash`` are where the chain started when it was signed (after a
prune, the chain hash of the last pruned row): a start that moved since must show the link of
a dropped month's row it replaced (migration 0024). Anchors of earlier releases carry none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jwt

from gateway.auth.service_tokens import ServiceTokenSigner

ANCHOR_TYPE = "gateway-audit-anchor+jwt"
ANCHOR_AUDIENCE = "gateway-audit-anchor"
_HASH = re.compile(r"^[0-9a-f]{64}$")


class AnchorInvalid(Exception):
    """The anchor cannot be trusted; the message says why (it quotes no key material)."""


@dataclass(frozen=True, slots=True)
class Anchor:
    tenant_id: str
    chain_seq: int
    chain_hash: str
    issued_at: datetime
    key_id: str
    start_seq: int | None = None
    start_hash: str | None = None
    """Where the chain started when the anchor was signed (``None``: an earlier release's anchor)."""


def sign_anchor(
    signer: ServiceTokenSigner,
    *,
    issuer: str,
    tenant_id: str,
    chain_seq: int,
    chain_hash: str,
    start_seq: int,
    start_hash: str,
    now: datetime,
) -> str:
    claims = {
        "iss": issuer,
        "aud": ANCHOR_AUDIENCE,
        "tenant_id": tenant_id,
        "chain_seq": chain_seq,
        "chain_hash": chain_hash,
        "start_seq": start_seq,
        "start_hash": start_hash,
        "iat": int(now.timestamp()),
    }
    return signer.sign_document(claims, typ=ANCHOR_TYPE)


def read_anchor(token: str, *, jwks: dict[str, Any], issuer: str, tenant_id: str) -> Anchor:
    """The anchor ``token`` holds, once its signature verifies with a key of ``jwks``."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.InvalidTokenError:
        raise AnchorInvalid("it is not a signed anchor (a compact JWS)") from None
    if header.get("typ") != ANCHOR_TYPE:
        raise AnchorInvalid(f"it is not an audit anchor (typ {header.get('typ')!r})")
    keys = {key.get("kid"): key for key in jwks.get("keys", [])}
    jwk = keys.get(header.get("kid"))
    if jwk is None:
        raise AnchorInvalid(f"it was signed with key {header.get('kid')!r}, which is not in the gateway's key set")
    try:
        claims = jwt.decode(
            token,
            key=jwt.PyJWK(jwk),
            algorithms=[jwk["alg"]],
            audience=ANCHOR_AUDIENCE,
            issuer=issuer,
            options={"require": ["iss", "aud", "iat"], "verify_exp": False},
        )
    except jwt.InvalidSignatureError:
        raise AnchorInvalid("its signature does not verify: the anchor was altered or signed elsewhere") from None
    except jwt.InvalidTokenError as exc:
        raise AnchorInvalid(f"it does not verify ({type(exc).__name__})") from None
    seq, link, tenant = claims.get("chain_seq"), claims.get("chain_hash"), claims.get("tenant_id")
    if type(seq) is not int or seq < 0 or not isinstance(link, str) or not _HASH.fullmatch(link):
        raise AnchorInvalid("it carries no valid chain position and hash")
    if tenant != tenant_id:
        raise AnchorInvalid(f"it anchors tenant {tenant!r}, not {tenant_id!r}")
    start_seq, start_hash = claims.get("start_seq"), claims.get("start_hash")
    if (start_seq, start_hash) != (None, None) and (
        type(start_seq) is not int or not 0 <= start_seq <= seq
        or not isinstance(start_hash, str) or not _HASH.fullmatch(start_hash)
    ):
        raise AnchorInvalid("it carries no valid chain start")
    return Anchor(
        tenant_id=tenant, chain_seq=seq, chain_hash=link, issued_at=datetime.fromtimestamp(claims["iat"], UTC),
        key_id=str(header["kid"]), start_seq=start_seq, start_hash=start_hash,
    )
