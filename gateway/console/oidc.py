"""Console sign-in with an OpenID Connect provider: the authorization-code flow with PKCE.

The provider's endpoints and keys come from its discovery document (its ``issuer`` must be
the configured one). A sign-in under way lives only in the browser that started it: its
``state``, ``nonce``, PKCE verifier and expiry are the value of an ``HttpOnly`` cookie
scoped to the sign-in's paths, so starting one writes nothing (the start is open to anyone,
and a row per request would let anyone fill a table). The callback must bring back the
cookie's ``state``; the cookie is cleared by every answer to it, and the provider redeems a
code once, so a sign-in completes at most once. Forging one's own cookie gains nothing: its
values only have to agree with what that same browser sent to the provider. The ID token
goes through the same ``TokenVerifier`` and tenant directory as an API token — issuer the
provider, audience the client id, keys its JWKS — so its ``sub``, ``tenant_id`` and
``roles`` claims give the same ``Principal``; its ``nonce`` must then be the cookie's.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
import msgspec
import structlog

from gateway.auth.jwks import JwksCache
from gateway.auth.tokens import Claims, InvalidToken, TokenVerifier
from gateway.settings import JwtSettings, Settings
from gateway.tools.http_transport import IDENTITY, EncodedBody, read_capped

log = structlog.get_logger("gateway.console.oidc")

DISCOVERY_PATH = "/.well-known/openid-configuration"
DISCOVERY_CACHE_S = 300.0
DISCOVERY_RETRY_S = 5.0
MAX_DOCUMENT_BYTES = 256 * 1024
SIGN_IN_TTL_S = 600
ASYMMETRIC = ("ES256", "ES384", "PS256", "RS256", "RS384", "RS512")
"""ID tokens are checked with the provider's published keys only, never with a shared secret."""

_PARAM = re.compile(r"^[\x21-\x7e]{1,2048}$")
"""What a ``state`` or ``code`` may look like: printable ASCII, bounded."""

_SECRET = r"[A-Za-z0-9_-]{43}"
_BROWSER_VALUE = re.compile(rf"^({_SECRET})\.({_SECRET})\.({_SECRET})\.([0-9]{{10,12}})$")
"""The sign-in cookie: ``state.nonce.verifier.expires`` (three ``b64url`` of 32 random
bytes, and a Unix time); anything else is no sign-in."""


class SignInFailed(Exception):
    """The provider's answer cannot sign anyone in; ``reason`` is a short word for the logs."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Discovery(msgspec.Struct):
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


class TokenAnswer(msgspec.Struct):
    id_token: str


@dataclass(frozen=True, slots=True)
class Started:
    redirect_to: str
    browser_value: str
    """The sign-in cookie's value: all this sign-in keeps."""


@dataclass(frozen=True, slots=True)
class UnderWay:
    state: str
    nonce: str
    code_verifier: str


def _under_way(browser_value: str | None, now: float) -> UnderWay | None:
    found = _BROWSER_VALUE.fullmatch(browser_value) if browser_value is not None else None
    if found is None or int(found[4]) <= now:
        return None
    return UnderWay(state=found[1], nonce=found[2], code_verifier=found[3])


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _http_url(value: str) -> bool:
    return value.startswith(("https://", "http://"))


def _https_url(value: str) -> bool:
    return value.startswith("https://")


class OidcClient:
    """One per app: the provider's discovery document and keys, cached, and the sign-ins under way."""

    def __init__(self, settings: Settings, http: httpx.AsyncClient) -> None:
        oidc = settings.oidc
        assert oidc.issuer is not None and oidc.client_id
        self._issuer = oidc.issuer.rstrip("/")
        self._client_id = oidc.client_id
        self._client_secret = oidc.client_secret
        self._timeout_s = oidc.timeout_s
        self._http = http
        self._settings = settings
        self._discovery: Discovery | None = None
        self._fetched_at = 0.0
        self._failed_until = 0.0
        self._verifier: TokenVerifier | None = None
        self._lock = asyncio.Lock()

    async def _document(self, url: str, method: str = "GET", **request: Any) -> Any:
        async with asyncio.timeout(self._timeout_s):
            async with self._http.stream(
                method, url, headers={**IDENTITY, "accept": "application/json"}, timeout=httpx.Timeout(self._timeout_s),
                **request,
            ) as response:
                if response.status_code != 200:
                    raise SignInFailed(f"provider_status_{response.status_code}")
                body, complete = await read_capped(response, MAX_DOCUMENT_BYTES)
        if not complete:
            raise SignInFailed("provider_answer_too_large")
        return body

    async def discovery(self) -> Discovery:
        """The provider's discovery document, cached. A failed fetch is remembered for
        ``DISCOVERY_RETRY_S``: sign-ins, which anyone may start, then fail at once (or go on
        with the document last fetched) instead of each waiting its turn for the provider."""
        async with self._lock:
            now = time.monotonic()
            if self._discovery is not None and now - self._fetched_at < DISCOVERY_CACHE_S:
                return self._discovery
            if now < self._failed_until:
                if self._discovery is not None:
                    return self._discovery
                raise SignInFailed("discovery_failed")
            try:
                return await self._fetch_discovery()
            except SignInFailed:
                self._failed_until = time.monotonic() + DISCOVERY_RETRY_S
                if self._discovery is not None:
                    log.warning("oidc_discovery_stale", retry_in_s=DISCOVERY_RETRY_S)
                    return self._discovery
                raise

    async def _fetch_discovery(self) -> Discovery:
        try:
            body = await self._document(self._issuer + DISCOVERY_PATH)
            found = msgspec.json.decode(body, type=Discovery)
        except (httpx.HTTPError, EncodedBody, TimeoutError, msgspec.DecodeError, RecursionError) as exc:
            log.warning("oidc_discovery_failed", error_type=type(exc).__name__)
            raise SignInFailed("discovery_failed") from None
        # An issuer on https keeps its endpoints on https: the token endpoint gets the client
        # secret, and the key set decides whose ID tokens are believed.
        scheme_ok = _https_url if self._issuer.startswith("https://") else _http_url
        if found.issuer.rstrip("/") != self._issuer or not all(
            scheme_ok(url) for url in (found.authorization_endpoint, found.token_endpoint, found.jwks_uri)
        ):
            log.warning("oidc_discovery_failed", problem="mismatch")
            raise SignInFailed("discovery_mismatch")
        if self._discovery is None or found.jwks_uri != self._discovery.jwks_uri:
            jwks = JwksCache(found.jwks_uri, self._http, cache_s=self._settings.jwks.cache_s,
                             timeout_s=self._timeout_s)
            self._verifier = TokenVerifier(
                msgspec.structs.replace(
                    self._settings,
                    jwt=JwtSettings(secret=None, algorithms=ASYMMETRIC, issuer=found.issuer,
                                    audience=self._client_id, leeway_s=self._settings.jwt.leeway_s,
                                    max_lifetime_s=self._settings.jwt.max_lifetime_s),
                ),
                jwks,
            )
        self._discovery, self._fetched_at = found, time.monotonic()
        return found

    async def start(self, redirect_uri: str) -> Started:
        """A new sign-in: where to send the browser, and the value of its binding cookie."""
        found = await self.discovery()
        state, nonce, verifier = (b64url(secrets.token_bytes(32)) for _ in range(3))
        expires = int(time.time()) + SIGN_IN_TTL_S
        query = urlencode({
            "response_type": "code",
            "client_id": self._client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid",
            "state": state,
            "nonce": nonce,
            "code_challenge": b64url(hashlib.sha256(verifier.encode()).digest()),
            "code_challenge_method": "S256",
        })
        separator = "&" if "?" in found.authorization_endpoint else "?"
        return Started(redirect_to=f"{found.authorization_endpoint}{separator}{query}",
                       browser_value=f"{state}.{nonce}.{verifier}.{expires}")

    async def finish(self, *, state: str, code: str, browser_value: str | None, redirect_uri: str) -> Claims:
        """The verified identity of a browser back from the provider; ``SignInFailed`` otherwise.
        ``browser_value`` is the browser's sign-in cookie, which the caller clears whatever
        comes of this."""
        if not _PARAM.fullmatch(state) or not _PARAM.fullmatch(code):
            raise SignInFailed("malformed_callback")
        row = _under_way(browser_value, time.time())
        if row is None:
            raise SignInFailed("no_sign_in_under_way")
        if not hmac.compare_digest(state.encode(), row.state.encode()):
            raise SignInFailed("other_state")
        found = await self.discovery()
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "code_verifier": row.code_verifier, "client_id": self._client_id}
        auth = (self._client_id, self._client_secret) if self._client_secret else None
        try:
            body = await self._document(found.token_endpoint, "POST", data=form, auth=auth)
            answer = msgspec.json.decode(body, type=TokenAnswer)
        except (httpx.HTTPError, EncodedBody, TimeoutError, msgspec.DecodeError, RecursionError) as exc:
            log.warning("oidc_token_exchange_failed", error_type=type(exc).__name__)
            raise SignInFailed("token_exchange_failed") from None
        assert self._verifier is not None
        try:
            claims = await self._verifier.verify(answer.id_token)
        except InvalidToken as exc:
            raise SignInFailed(f"id_token_{exc.reason}") from None
        verified = jwt.decode(answer.id_token, options={"verify_signature": False})  # verified just above
        nonce = verified.get("nonce")
        if not isinstance(nonce, str) or not hmac.compare_digest(nonce.encode(), row.nonce.encode()):
            raise SignInFailed("nonce_mismatch")
        # OpenID Connect Core 3.1.3.7: a token for several audiences names the party it was
        # issued to (azp), which must be this client; named at all, it must be this client.
        audiences, party = verified.get("aud"), verified.get("azp")
        several = isinstance(audiences, list) and len(audiences) > 1
        if (several or party is not None) and party != self._client_id:
            raise SignInFailed("authorized_party_mismatch")
        return claims
