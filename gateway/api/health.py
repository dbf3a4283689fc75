"""Liveness and readiness probes (no authentication)."""

from __future__ import annotations

from litestar import get
from litestar.datastructures import State

from gateway.api.openapi import error_responses
from gateway.api.schemas import Health
from gateway.errors import ErrorCode, GatewayError


@get("/healthz", tags=["health"], summary="Liveness")
async def healthz() -> Health:
    """The process is up and serving."""
    return Health(status="ok")


@get("/readyz", tags=["health"], summary="Readiness", responses=error_responses(503))
async def readyz(state: State) -> Health:
    """The database answers; otherwise 503."""
    try:
        await state.db.ping()
    except Exception:  # any failure to answer means "not ready"; the probe says nothing more
        raise GatewayError(
            ErrorCode.SERVICE_UNAVAILABLE, "The database is not reachable.", headers={"Retry-After": "1"}
        ) from None
    return Health(status="ready")
