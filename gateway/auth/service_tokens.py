"""Tokens the gateway signs for the business services it calls.

For every HTTP tool call the gateway signs a short-lived JWT with its own asymmetric key
(ES256 for an EC P-256 key, RS256 for an RSA key): audience = the called service, claims
``sub``, ``tenant_id``, ``roles`` from the caller's verified token, and ``run_id`` and
``tool_call_id`` of the call. A service trusts that token, never the arguments. The public
half is served as a JWKS (``GET /.well-known/jwks.json``) so services can verify it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import msgspec
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from gateway.auth.principal import Principal
from gateway.settings import Settings, SettingsError


class ServiceTokenSigner:
    """Signs one token per call; ``jwks`` is the public key set services verify it with."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, *, issuer: str, ttl_s: int) -> None:
        if isinstance(private_key, ec.EllipticCurvePrivateKey):
            if not isinstance(private_key.curve, ec.SECP256R1):
                raise SettingsError("the service signing key must be an EC P-256 (ES256) or an RSA (RS256) key")
            self.algorithm = "ES256"
            public_jwk: dict[str, Any] = ECAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
        elif isinstance(private_key, rsa.RSAPrivateKey):
            if private_key.key_size < 2048:
                raise SettingsError("an RSA service signing key must have at least 2048 bits")
            self.algorithm = "RS256"
            public_jwk = RSAAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
        else:
            raise SettingsError("the service signing key must be an EC P-256 (ES256) or an RSA (RS256) key")
        self.key_id = jwk_thumbprint(public_jwk)
        self._key = private_key
        self._issuer = issuer
        self._ttl_s = ttl_s
        self._header_segment = _b64(_encode_json({"alg": self.algorithm, "kid": self.key_id, "typ": "JWT"})) + b"."
        self.public_jwk = {**public_jwk, "kid": self.key_id, "use": "sig", "alg": self.algorithm}

    @classmethod
    def from_pem(cls, pem: bytes, *, issuer: str, ttl_s: int) -> ServiceTokenSigner:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            # The message of the underlying error may quote the key material: never show it.
            raise SettingsError("the service signing key is not an unencrypted PEM private key") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise SettingsError("the service signing key must be an EC P-256 (ES256) or an RSA (RS256) key")
        return cls(key, issuer=issuer, ttl_s=ttl_s)

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self.public_jwk]}

    def sign(self, principal: Principal, *, audience: str, run_id: str, tool_call_id: str) -> str:
        """One token per call. Made here rather than by ``jwt.encode``: the header segment is
        encoded once, the claims with msgspec, and the key signs directly (PyJWT's own steps
        cost as much again as the signature). Any JWT library reads it the same."""
        now = int(time.time())
        claims = {
            "iss": self._issuer,
            "aud": audience,
            "sub": principal.user_id,
            "tenant_id": principal.tenant_id,
            "roles": sorted(principal.roles),
            "run_id": run_id,
            "tool_call_id": tool_call_id,
            "iat": now,
            "nbf": now,
            "exp": now + self._ttl_s,
            "jti": uuid.uuid4().hex,
        }
        signing_input = self._header_segment + _b64(_encode_json(claims))
        return (signing_input + b"." + _b64(self._signature(signing_input))).decode("ascii")

    def _signature(self, signing_input: bytes) -> bytes:
        if isinstance(self._key, ec.EllipticCurvePrivateKey):
            r, s = decode_dss_signature(self._key.sign(signing_input, _ECDSA_SHA256))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")  # JWS (RFC 7518 3.4): R || S, not DER
        return self._key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())

    def sign_document(self, claims: dict[str, Any], *, typ: str) -> str:
        """A JWS of ``claims`` under the same key (and ``kid``) as the service tokens, with its own
        ``typ`` so that it can never pass for a service token (an audit anchor, say)."""
        return jwt.encode(claims, self._key, algorithm=self.algorithm, headers={"kid": self.key_id, "typ": typ})


_encode_json = msgspec.json.Encoder().encode
_ECDSA_SHA256 = ec.ECDSA(hashes.SHA256())


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def jwk_thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638: a key id that names the key itself, stable across restarts and processes."""
    members = ("crv", "kty", "x", "y") if jwk["kty"] == "EC" else ("e", "kty", "n")
    canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


def generate_signing_key_pem() -> bytes:
    """A fresh EC P-256 private key in PEM (used for the demo; production keys come from settings)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_service_signer(settings: Settings) -> ServiceTokenSigner | None:
    """The signer from ``GATEWAY_SERVICE_SIGNING_KEY`` (a PEM) or ``..._FILE`` (a path), if either is set."""
    if settings.services.signing_key and settings.services.signing_key_file:
        raise SettingsError("set GATEWAY_SERVICE_SIGNING_KEY or GATEWAY_SERVICE_SIGNING_KEY_FILE, not both")
    if settings.services.signing_key:
        # A PEM in one environment line may carry its line breaks as "\n".
        pem = settings.services.signing_key.replace("\\n", "\n").encode()
    elif settings.services.signing_key_file:
        try:
            pem = Path(settings.services.signing_key_file).read_bytes()
        except OSError as exc:
            raise SettingsError(
                f"GATEWAY_SERVICE_SIGNING_KEY_FILE cannot be read ({exc.strerror or type(exc).__name__})"
            ) from None
    else:
        return None
    return ServiceTokenSigner.from_pem(pem, issuer=settings.services.token_issuer, ttl_s=settings.services.token_ttl_s)
