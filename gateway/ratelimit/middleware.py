"""Refuse a request over its tenant's or user's rate with ``429 RATE_LIMITED`` and ``Retry-After``.

Runs after authentication (it needs the verified tenant and user) and only when a limit
is configured; a request that finds tokens in the process costs no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode, GatewayError
from gateway.ratelimit.limiter import RateLimited, RateLimiter

if TYPE_CHECKING:  # the services import the API, which imports the auth middleware
    from gateway.wiring import ServicesSlot

log = structlog.get_logger("gateway.ratelimit")


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, *, services: ServicesSlot) -> None:
        self.app = app
        self._services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get("user")
        if type(principal) is Principal:
            await self._check(principal)
        await self.app(scope, receive, send)

    async def _check(self, principal: Principal) -> None:
        limiter: RateLimiter | None = self._services.services.rate_limiter
        if limiter is None:  # the app installs this middleware only with a limiter
            return
        await spend_rate(limiter, principal)


async def spend_rate(limiter: RateLimiter, principal: Principal) -> None:
    """Spend one token of the caller's tenant and user, or raise ``RATE_LIMITED`` with ``Retry-After``."""
    try:
        await limiter.check(principal.tenant_id, principal.user_id)
    except RateLimited as exc:
        log.info("rate_limited", scope=exc.scope, retry_after_s=exc.retry_after)
        raise GatewayError(
            ErrorCode.RATE_LIMITED,
            f"Too many requests for this {exc.scope}; retry after {exc.retry_after} s.",
            headers={"Retry-After": str(exc.retry_after)},
        ) from None
