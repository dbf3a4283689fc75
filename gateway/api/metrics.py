"""``GET /metrics``: Prometheus text exposition (public route; keep it off the internet at the proxy)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import sqlalchemy as sa
from litestar import Response, get
from litestar.datastructures import State
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.db.engine import Database
from gateway.db.models import Approval
from gateway.observability import metrics

SCRAPE_DATABASE_TIMEOUT_S = 2.0


async def pending_approvals(db: Database) -> dict[str, int]:
    approvals = Approval.__table__
    query = (
        sa.select(approvals.c.tenant_id, sa.func.count())
        .where(approvals.c.status == "pending", approvals.c.expires_at > datetime.now(UTC))
        .group_by(approvals.c.tenant_id)
    )
    async with db.connect() as conn:
        return {tenant: int(count) for tenant, count in (await conn.execute(query)).all()}


@get("/metrics", include_in_schema=False)
async def scrape_metrics(state: State) -> Response[bytes]:
    """Counters and histograms of this process (or of every worker), and gauges read from the database."""
    try:
        async with asyncio.timeout(SCRAPE_DATABASE_TIMEOUT_S):
            pending: dict[str, int] | None = await pending_approvals(state.db)
    except Exception:  # a scrape must answer while the database is down: it reports database_up 0
        pending = None
    body = metrics.render(database_up=pending is not None, pending_approvals=pending)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
