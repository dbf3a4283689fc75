"""Signing keys of a test identity provider (RS256 and ES256) and tokens signed with them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from functools import cache
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


@cache
def rsa_key(name: str = "rsa-1") -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@cache
def ec_key(name: str = "ec-1") -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def public_jwk(kid: str, key: Any, alg: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if alg.startswith(("RS", "PS")) else ECAlgorithm
    jwk = algorithm.to_jwk(key.public_key(), as_dict=True)
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


def public_pem(key: Any) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def claims(tenant: str = "acme", user: str = "alice", roles: list[str] | None = None, ttl: int = 600, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    values: dict[str, Any] = {"sub": user, "tenant_id": tenant, "roles": roles or ["member"], "iat": now, "exp": now + ttl}
    values.update(extra)
    return values


def signed(key: Any, alg: str, kid: str | None, payload: dict[str, Any]) -> str:
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid} if kid else None)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_with_raw_key(secret: bytes, payload: dict[str, Any], kid: str | None = None) -> str:
    """An HS256 token over any bytes as the secret (PyJWT refuses a PEM here; an attacker would not)."""
    header: dict[str, Any] = {"alg": "HS256", "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def hs256_over_text(secret: str, header: str, payload: str) -> str:
    """An HS256 token whose header and claims are the JSON texts given, as written (a key
    given twice, say, which no encoder of a dict can produce)."""
    signing_input = f"{_b64(header.encode())}.{_b64(payload.encode())}"
    signature = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def unsigned(payload: dict[str, Any], alg: str = "none") -> str:
    header = {"alg": alg, "typ": "JWT"}
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}."
