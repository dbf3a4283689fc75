"""Liveness and readiness probes (no authentication; ``GET`` and ``HEAD``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from litestar import get, head
from litestar.di import NamedDependency

from gateway.api.openapi import error_responses
from gateway.api.schemas import Health
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError

READINESS_CACHE_S = 1.0
"""How long one answer of the database is reused: probes, however many, cost at most one
query per second per process."""


class Readiness:
    """Whether the database answered, asked at most once per ``ttl_s``; concurrent probes
    wait for the one query in flight instead of sending their own."""

    def __init__(
        self, db: Database, *, ttl_s: float = READINESS_CACHE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._clock = clock
        self._ready = False
        self._checked_at: float | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> bool:
        if self._fresh():
            return self._ready
        async with self._lock:
            if not self._fresh():
                try:
                    await self._db.ping()
                    self._ready = True
                except Exception:  # any failure to answer means "not ready"; the probe says nothing more
                    self._ready = False
                self._checked_at = self._clock()
        return self._ready

    def _fresh(self) -> bool:
        return self._checked_at is not None and self._clock() - self._checked_at < self._ttl_s


@get("/healthz", tags=["health"], summary="Liveness")
async def healthz() -> Health:
    """The process is up and serving."""
    return Health(status="ok")


@head("/healthz", tags=["health"], summary="Liveness, without a body")
async def healthz_head() -> None:
    """The process is up and serving."""


async def _require_ready(readiness: Readiness) -> None:
    if not await readiness.ready():
        raise GatewayError(
            ErrorCode.SERVICE_UNAVAILABLE, "The database is not reachable.", headers={"Retry-After": "1"}
        )


@get("/readyz", tags=["health"], summary="Readiness", responses=error_responses(503))
async def readyz(readiness: NamedDependency[Readiness]) -> Health:
    """The database answered within the last second; otherwise 503."""
    await _require_ready(readiness)
    return Health(status="ready")


@head("/readyz", tags=["health"], summary="Readiness, without a body", responses=error_responses(503))
async def readyz_head(readiness: NamedDependency[Readiness]) -> None:
    """The database answered within the last second; otherwise 503."""
    await _require_ready(readiness)
