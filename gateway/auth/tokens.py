"""Bearer token verification (PyJWT): one way in for identity.

HS* tokens are checked with ``GATEWAY_JWT_SECRET``; RS*/ES*/PS* tokens with a key from
the JWKS, chosen by ``kid``. The algorithm must be on the allow-list *and* match the key's
family, so ``none`` and algorithm confusion (an HS256 token "signed" with an RSA public
key) are refused. ``exp`` is required and, with ``iat`` (or the current time without it),
may span at most ``GATEWAY_JWT_MAX_LIFETIME_S``: a token that never really expires is
refused. So are tokens whose times (``exp``, ``iat``, ``nbf``) are not finite numbers,
whose identity holds text PostgreSQL cannot store or a control character (a line break
would make ``"alice\n"`` a user of its own), and whose header or claims give a key twice
(JSON leaves which value wins undefined: a proxy or an audit pipeline reading the first
``tenant_id`` would see another tenant than the one the gateway acts for). Every failure
raises ``InvalidToken``; the reason is for logs only.
"""

from __future__ import annotations

import binascii
import math
import re
import time

import jwt
import msgspec
from jwt.utils import base64url_decode

from gateway.auth.jwks import JwksCache, JwksKeyNotFound
from gateway.settings import Settings
from gateway.text import is_storable
from gateway.tools.repeated_keys import repeated_key

_KEY_FAMILY = {"HS": "oct", "RS": "RSA", "PS": "RSA", "ES": "EC"}


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _bad_text(value: str, max_length: int) -> bool:
    """Empty, too long, holding what no database text column can store (NUL, a lone
    surrogate: JSON's ``\\ud800`` decodes to one, and UTF-8 cannot encode it), or a control
    character (a line break, a tab, an escape): no identifier has one."""
    return not value or len(value) > max_length or not is_storable(value) or _CONTROL.search(value) is not None


def _repeats_a_key(token: str) -> bool:
    """Whether the (verified) token's header or claims give one key twice."""
    try:
        parts = [base64url_decode(part) for part in token.split(".")[:2]]
    except (binascii.Error, ValueError):
        return True
    return any(repeated_key(part) is not None for part in parts)


def _time_claim(payload: dict[str, object], name: str) -> float | None:
    """An optional NumericDate claim as a float: absent is ``None``; anything but a finite
    number (a string, a bool, null, an int past a float's range) is refused. PyJWT checked
    the value against the clock already; one far in the past means "long ago"."""
    if name not in payload:
        return None
    value = payload[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidToken("claim_type")
    if isinstance(value, int) and not -_FAR < value < _FAR:
        raise InvalidToken("claim_value")
    if not math.isfinite(value):
        raise InvalidToken("claim_value")
    return float(value)


_FAR = 10**15  # seconds: about 30 million years either side of 1970


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


class VerifiedTokenCache:
    """Tokens already verified, so that a client sending the same token on every call pays
    for the signature check once. An entry never outlives its token's ``exp`` nor
    ``max_age_s`` (so a key withdrawn from the JWKS stops being honoured within that time),
    and ``nbf`` is checked again on every hit."""

    def __init__(self, *, max_entries: int = 10_000, max_age_s: float = 60.0) -> None:
        self._entries: dict[str, tuple[float, float | None, Claims]] = {}
        self._max_entries = max_entries
        self._max_age_s = max_age_s

    def get(self, token: str, now: float, leeway: float) -> Claims | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        valid_until, not_before, claims = entry
        if now >= valid_until:
            del self._entries[token]
            return None
        if not_before is not None and now + leeway < not_before:
            return None
        return claims

    def put(self, token: str, claims: Claims, not_before: float | None, now: float, leeway: float) -> None:
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        valid_until = min(float(claims.exp) + leeway, now + self._max_age_s)
        self._entries[token] = (valid_until, not_before, claims)


class TokenVerifier:
    def __init__(self, settings: Settings, jwks: JwksCache | None = None) -> None:
        self._secret = settings.jwt.secret
        self._algorithms = frozenset(settings.jwt.algorithms)
        self._issuer = settings.jwt.issuer
        self._audience = settings.jwt.audience
        self._leeway = settings.jwt.leeway_s
        self._max_lifetime_s = settings.jwt.max_lifetime_s
        self._jwks = jwks
        required = ["exp", "sub"]
        if self._issuer:
            required.append("iss")
        if self._audience:
            required.append("aud")
        self._options = {"require": required, "verify_aud": self._audience is not None}
        self._cache = VerifiedTokenCache()

    def cached(self, token: str) -> Claims | None:
        """The claims of a token verified recently, without awaiting anything."""
        return self._cache.get(token, time.time(), self._leeway)

    async def verify(self, token: str) -> Claims:
        now = time.time()
        cached = self._cache.get(token, now, self._leeway)
        if cached is not None:
            return cached
        claims, not_before = await self._verify(token, now)
        self._cache.put(token, claims, not_before, now, self._leeway)
        return claims

    async def _verify(self, token: str, now: float) -> tuple[Claims, float | None]:
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
        if _repeats_a_key(token):
            raise InvalidToken("repeated_key")
        try:
            claims = msgspec.convert(payload, Claims, strict=True)
        except msgspec.ValidationError:
            raise InvalidToken("claim_type") from None
        issued_at = _time_claim(payload, "iat")
        not_before = _time_claim(payload, "nbf")
        self._check_lifetime(claims.exp, issued_at, now)
        if _bad_text(claims.sub, 128) or _bad_text(claims.tenant_id, 64):
            raise InvalidToken("claim_value")
        if any(_bad_text(role, 64) for role in claims.roles):
            raise InvalidToken("claim_value")
        return claims, not_before

    def _check_lifetime(self, exp: float, issued_at: float | None, now: float) -> None:
        start = issued_at if issued_at is not None else now
        if any(isinstance(value, float) and not math.isfinite(value) for value in (exp, start)):
            raise InvalidToken("claim_value")
        # Compared, never subtracted: an int exp of 10**400 is exact here and overflows a float.
        if exp > start + self._max_lifetime_s:
            raise InvalidToken("lifetime_too_long")

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
        if jwk.key_type != family or _key_algorithm(jwk) not in (None, algorithm):
            raise InvalidToken("key_algorithm_mismatch")
        return jwk.key


def _key_algorithm(jwk: Any) -> str | None:
    """The one algorithm a key of the JWKS may sign with: its ``alg``; without one, an EC key's
    curve names it (P-256 is ES256), an RSA key's nothing — PyJWT's default of RS256 would
    refuse an identity provider's RS384 or PS256 tokens whose JWKS, as many do, omits ``alg``."""
    declared = getattr(jwk, "_jwk_data", {}).get("alg")
    if isinstance(declared, str) and declared:
        return declared
    if jwk.key_type == "RSA":
        return None
    return str(jwk.algorithm_name) if jwk.algorithm_name else None
