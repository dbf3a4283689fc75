"""Refuse a request over its tenant's or user's rate with ``429 RATE_LIMITED`` and ``Retry-After``.

Runs after authentication (it needs the verified tenant and user) and only when a limit
is configured; a request that finds tokens in the process costs no I/O.
"""

from __future__ import annotations

import structlog
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode, GatewayError
from gateway.ratelimit.limiter import RateLimited, RateLimiter

log = structlog.get_logger("gateway.ratelimit")


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get("user")
        if type(principal) is Principal:
            limiter: RateLimiter = scope["litestar_app"].state.rate_limiter
            try:
                await limiter.check(principal.tenant_id, principal.user_id)
            except RateLimited as exc:
                log.info("rate_limited", scope=exc.scope, retry_after_s=exc.retry_after)
                raise GatewayError(
                    ErrorCode.RATE_LIMITED,
                    f"Too many requests for this {exc.scope}; retry after {exc.retry_after} s.",
                    headers={"Retry-After": str(exc.retry_after)},
                ) from None
        await self.app(scope, receive, send)
