"""Signing keys of the identity provider, fetched from its JWKS URL and cached.

An unknown ``kid`` triggers a refresh (a key rotation), but at most once every
``MIN_REFRESH_INTERVAL_S`` so that tokens with made-up key ids cannot hammer the provider.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import jwt
import structlog

log = structlog.get_logger(__name__)

MIN_REFRESH_INTERVAL_S = 10.0


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
            response = await self._client.get(self._url, timeout=self._timeout)
            response.raise_for_status()
            keyset = jwt.PyJWKSet.from_dict(response.json())
        except (httpx.HTTPError, ValueError, jwt.PyJWTError) as exc:
            # Keep serving the keys we have; the next unknown kid tries again after the interval.
            log.warning("jwks_refresh_failed", error_type=type(exc).__name__)
            self._fetched_at = time.monotonic() - self._cache_s + self._min_refresh_interval_s
            return
        self._keys = {key.key_id: key for key in keyset.keys if key.key_id}
        self._fetched_at = time.monotonic()
        log.info("jwks_refreshed", keys=len(self._keys))
