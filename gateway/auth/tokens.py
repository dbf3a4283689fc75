"""Bearer token verification (PyJWT): one way in for identity.

HS* tokens are checked with ``GATEWAY_JWT_SECRET``; RS*/ES*/PS* tokens with a key from
the JWKS, chosen by ``kid``. The algorithm must be on the allow-list *and* match the key's
family, so ``none`` and algorithm confusion (an HS256 token "signed" with an RSA public
key) are refused. Every failure raises ``InvalidToken``; the reason is for logs only.
"""

from __future__ import annotations

import msgspec
import jwt

from gateway.auth.jwks import JwksCache, JwksKeyNotFound
from gateway.settings import Settings

_KEY_FAMILY = {"HS": "oct", "RS": "RSA", "PS": "RSA", "ES": "EC"}


class InvalidToken(Exception):
    """The token cannot be trusted; ``reason`` is a short, token-free word for the logs."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Claims(msgspec.Struct, frozen=True):
    sub: str
    tenant_id: str
    roles: list[str]
    exp: int | float


class TokenVerifier:
    def __init__(self, settings: Settings, jwks: JwksCache | None = None) -> None:
        self._secret = settings.jwt_secret
        self._algorithms = frozenset(settings.jwt_algorithms)
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._leeway = settings.jwt_leeway_s
        self._jwks = jwks
        required = ["exp", "sub"]
        if self._issuer:
            required.append("iss")
        if self._audience:
            required.append("aud")
        self._options = {"require": required, "verify_aud": self._audience is not None}

    async def verify(self, token: str) -> Claims:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("malformed") from None
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in self._algorithms:
            raise InvalidToken("algorithm_not_allowed")
        key = await self._key_for(algorithm, header.get("kid"))
        try:
            payload = jwt.decode(
                token,
                key=key,
                algorithms=[algorithm],
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options=self._options,  # type: ignore[arg-type]
            )
        except jwt.ExpiredSignatureError:
            raise InvalidToken("expired") from None
        except jwt.ImmatureSignatureError:
            raise InvalidToken("not_yet_valid") from None
        except (jwt.InvalidAudienceError, jwt.InvalidIssuerError):
            raise InvalidToken("wrong_issuer_or_audience") from None
        except jwt.PyJWTError:
            raise InvalidToken("invalid") from None
        try:
            claims = msgspec.convert(payload, Claims, strict=True)
        except msgspec.ValidationError:
            raise InvalidToken("claim_type") from None
        if not claims.sub or len(claims.sub) > 128 or not claims.tenant_id or len(claims.tenant_id) > 64:
            raise InvalidToken("claim_value")
        if any(not role or len(role) > 64 for role in claims.roles):
            raise InvalidToken("claim_value")
        return claims

    async def _key_for(self, algorithm: str, kid: object) -> object:
        family = _KEY_FAMILY.get(algorithm[:2])
        if family == "oct":
            if self._secret is None:
                raise InvalidToken("no_secret_configured")
            return self._secret
        if self._jwks is None:
            raise InvalidToken("no_jwks_configured")
        try:
            jwk = await self._jwks.key_for(kid if isinstance(kid, str) else None)
        except JwksKeyNotFound:
            raise InvalidToken("unknown_kid") from None
        if jwk.key_type != family or (jwk.algorithm_name and jwk.algorithm_name != algorithm):
            raise InvalidToken("key_algorithm_mismatch")
        return jwk.key
