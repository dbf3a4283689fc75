"""Signing keys of the identity provider, fetched from its JWKS URL and cached.

An unknown ``kid`` triggers a refresh (a key rotation), but at most once every
``MIN_REFRESH_INTERVAL_S`` so that tokens with made-up key ids cannot hammer the provider.
A fetch asks for an uncompressed body, reads at most ``MAX_JWKS_BYTES`` of it and ends
within the timeout, however slowly the provider sends; a failed fetch keeps the old keys.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import jwt
import msgspec
import structlog

from gateway.tools.http_transport import IDENTITY, EncodedBody, read_capped

log = structlog.get_logger(__name__)

MIN_REFRESH_INTERVAL_S = 10.0
MAX_JWKS_BYTES = 512 * 1024


class JwksKeyNotFound(Exception):
    pass


class JwksCache:
    def __init__(
        self,
        url: str,
        client: httpx.AsyncClient,
        *,
        cache_s: float,
        timeout_s: float,
        min_refresh_interval_s: float = MIN_REFRESH_INTERVAL_S,
    ) -> None:
        self._url = url
        self._client = client
        self._cache_s = cache_s
        self._min_refresh_interval_s = min_refresh_interval_s
        self._timeout_s = timeout_s
        self._timeout = httpx.Timeout(timeout_s)
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    async def key_for(self, kid: str | None) -> jwt.PyJWK:
        if kid is None:
            raise JwksKeyNotFound("token has no kid")
        now = time.monotonic()
        if kid in self._keys and now - self._fetched_at < self._cache_s:
            return self._keys[kid]
        async with self._lock:
            now = time.monotonic()
            stale = now - self._fetched_at >= self._cache_s
            may_refresh = now - self._fetched_at >= self._min_refresh_interval_s
            if (kid not in self._keys and may_refresh) or stale:
                await self._refresh()
        try:
            return self._keys[kid]
        except KeyError:
            raise JwksKeyNotFound("no key with this kid") from None

    async def _refresh(self) -> None:
        try:
            keyset = jwt.PyJWKSet.from_dict(await self._fetch())
        except (httpx.HTTPError, EncodedBody, TimeoutError, ValueError, RecursionError, jwt.PyJWTError) as exc:
            # Keep serving the keys we have; the next unknown kid tries again after the interval.
            log.warning("jwks_refresh_failed", error_type=type(exc).__name__)
            self._fetched_at = time.monotonic() - self._cache_s + self._min_refresh_interval_s
            return
        # A kid that is not a string (a list, an object) names no token's key, and could not
        # even be a dict key: skip that key, keep the others.
        self._keys = {key.key_id: key for key in keyset.keys if isinstance(key.key_id, str) and key.key_id}
        self._fetched_at = time.monotonic()
        log.info("jwks_refreshed", keys=len(self._keys))

    async def _fetch(self) -> dict[str, object]:
        async with asyncio.timeout(self._timeout_s):  # the whole fetch, not each read
            async with self._client.stream("GET", self._url, headers=IDENTITY, timeout=self._timeout) as response:
                response.raise_for_status()
                body, complete = await read_capped(response, MAX_JWKS_BYTES)
        if not complete:
            raise ValueError("the JWKS is larger than MAX_JWKS_BYTES")
        document = msgspec.json.decode(body)
        if not isinstance(document, dict):
            raise ValueError("the JWKS is not a JSON object")
        return document
