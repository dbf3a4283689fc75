"""``GET /metrics``: Prometheus text exposition.

Outside the JWT middleware (a scraper is no tenant's user). With ``GATEWAY_METRICS_TOKEN``
set, a scrape must send it as a bearer token (Prometheus' ``authorization`` setting does);
without, keep the route off the internet at the proxy. The gauges read from the database
are read at most once per second per process for requests without a token, however many
arrive; with the token set, a request without it reads nothing, and the scraper that shows
it reads them fresh.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from datetime import UTC, datetime

import sqlalchemy as sa
from litestar import Request, Response, get
from litestar.di import NamedDependency

from gateway.db.engine import Database
from gateway.db.models import Approval
from gateway.errors import ErrorCode, GatewayError
from gateway.observability.metrics import Metrics

SCRAPE_DATABASE_TIMEOUT_S = 2.0
DATABASE_GAUGES_CACHE_S = 1.0
MEDIA_TYPE = "text/plain; version=0.0.4"
"""Prometheus' text format 0.0.4; Litestar appends ``; charset=utf-8`` to any ``text/`` type, so
prometheus-client's ``CONTENT_TYPE_LATEST``, which has it already, would name two charsets."""


async def pending_approvals(db: Database) -> dict[str, int]:
    approvals = Approval.__table__
    query = (
        sa.select(approvals.c.tenant_id, sa.func.count())
        .where(approvals.c.status == "pending", approvals.c.expires_at > datetime.now(UTC))
        .group_by(approvals.c.tenant_id)
    )
    async with db.connect() as conn:
        return {tenant: int(count) for tenant, count in (await conn.execute(query)).all()}


class DatabaseGauges:
    """The pending approvals by tenant (None: the database did not answer), read at most once per ``ttl_s``."""

    def __init__(
        self, db: Database, *, ttl_s: float = DATABASE_GAUGES_CACHE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._clock = clock
        self._pending: dict[str, int] | None = None
        self._read_at: float | None = None
        self._lock = asyncio.Lock()

    async def pending(self, *, fresh: bool = False) -> dict[str, int] | None:
        """``fresh``: read now whatever the age of the last answer (an authorised scraper's request)."""
        async with self._lock:
            if fresh or self._read_at is None or self._clock() - self._read_at >= self._ttl_s:
                try:
                    async with asyncio.timeout(SCRAPE_DATABASE_TIMEOUT_S):
                        self._pending = await pending_approvals(self._db)
                except Exception:  # a scrape must answer while the database is down: it reports database_up 0
                    self._pending = None
                self._read_at = self._clock()
            return self._pending


def scrape_allowed(request: Request, token: str | None) -> bool:
    if token is None:
        return True
    sent = request.headers.get("authorization", "")
    scheme, _, credentials = sent.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode())


class MetricsExposition:
    """What ``/metrics`` answers for one app: its metrics and the database gauges, behind the
    scrape token when one is set."""

    def __init__(
        self, metrics: Metrics, gauges: DatabaseGauges, *, token: str | None, tenant_labels: bool
    ) -> None:
        self.metrics = metrics
        self.gauges = gauges
        self._token = token
        self._tenant_labels = tenant_labels

    async def render(self, request: Request) -> bytes:
        if not scrape_allowed(request, self._token):
            raise GatewayError(ErrorCode.UNAUTHENTICATED, headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        # A scraper that showed the token reads the database now; anyone else gets an answer at most a second old.
        pending = await self.gauges.pending(fresh=self._token is not None)
        return self.metrics.render(
            database_up=pending is not None, pending_approvals=pending, tenant_labels=self._tenant_labels
        )


@get("/metrics", include_in_schema=False)
async def scrape_metrics(request: Request, metrics_exposition: NamedDependency[MetricsExposition]) -> Response[bytes]:
    """Counters and histograms of this process (or of every worker), and gauges read from the database."""
    return Response(content=await metrics_exposition.render(request), media_type=MEDIA_TYPE)
