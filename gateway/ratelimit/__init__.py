"""Rate limits per tenant and per user (see ``limiter`` for the design and its bounds)."""

from __future__ import annotations

from gateway.db.engine import Database
from gateway.ratelimit.limiter import Limit, RateLimiter
from gateway.ratelimit.store import create_token_store
from gateway.settings import Settings


def create_rate_limiter(settings: Settings, db: Database) -> RateLimiter | None:
    """The process's limiter, or ``None`` when no limit is configured."""
    if not settings.rate_limits.enabled:
        return None
    return RateLimiter(
        create_token_store(db),
        tenant=Limit.from_settings(settings.rate_limits.tenant_rps, settings.rate_limits.tenant_burst),
        user=Limit.from_settings(settings.rate_limits.user_rps, settings.rate_limits.user_burst),
    )
