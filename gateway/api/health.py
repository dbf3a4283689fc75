"""Liveness and readiness probes (no authentication; ``GET`` and ``HEAD``).

Readiness is the database: without it, 503. A part the gateway can serve without (an MCP
server behind the guard that is down) makes it ``degraded``, still 200, with a reason for each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import msgspec
from litestar import get, head
from litestar.di import NamedDependency

from gateway.api.openapi import error_responses
from gateway.api.schemas import Health
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError

READINESS_CACHE_S = 1.0
"""How long one answer of the database is reused: probes, however many, cost at most one
query per second per process."""


class DegradedComponent(msgspec.Struct, frozen=True):
    component: str
    """What is degraded, e.g. ``mcp_server:notes``."""
    reason: str


class ReadinessReport(msgspec.Struct, omit_defaults=True):
    status: str
    """``ready``, or ``degraded`` when a part listed in ``degraded`` is unavailable."""
    degraded: list[DegradedComponent] = []


class Readiness:
    """Whether the database answered, asked at most once per ``ttl_s``; concurrent probes
    wait for the one query in flight instead of sending their own. ``degraded`` names the
    parts the gateway serves without (``(component, reason)`` pairs)."""

    def __init__(
        self,
        db: Database,
        *,
        ttl_s: float = READINESS_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
        degraded: Callable[[], Sequence[tuple[str, str]]] | None = None,
    ) -> None:
        self.degraded = degraded or (lambda: ())
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
async def readyz(readiness: NamedDependency[Readiness]) -> ReadinessReport:
    """The database answered within the last second; otherwise 503. ``degraded`` (still 200)
    names each part that is unavailable, such as an MCP server, with its reason."""
    await _require_ready(readiness)
    parts = [DegradedComponent(component=component, reason=reason) for component, reason in readiness.degraded()]
    return ReadinessReport(status="degraded", degraded=parts) if parts else ReadinessReport(status="ready")


@head("/readyz", tags=["health"], summary="Readiness, without a body", responses=error_responses(503))
async def readyz_head(readiness: NamedDependency[Readiness]) -> None:
    """The database answered within the last second; otherwise 503."""
    await _require_ready(readiness)
