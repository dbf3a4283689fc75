"""Rate limits per tenant and per user, exact across processes, without a database round
trip per request.

The buckets live in the database (``rate_limit_buckets``: refilled at ``rate`` per second
up to ``burst``). A process does not ask the database for every request: it *leases* a
few tokens from a bucket at once and spends them locally, one per request. A request that
finds local tokens for its tenant and its user costs two dictionary lookups and a clock
read. When a share runs out, one lease refills it for every request waiting on it; a
share running low is topped up in the background before it runs out, so under steady load
requests rarely wait for the database at all.

Leases are sized to demand: a share starts by leasing one token, doubles its lease while
leases are used up quickly, halves it when leased tokens go unspent, and never leases more
than ``lease_cap(rate, burst)`` = max(burst / 10, rate / 20), between 1 and 100. Unspent
tokens expire after ``lease_ttl_s`` (1 s) and are lost, never returned.

Bound on over-admission: the database never hands out more than ``burst + rate * T``
tokens in T seconds, and a process holds at most 1.25 leases unspent; so across P
processes, any window of T seconds admits at most ``burst + rate * T + P * 1.25 * cap``
requests of one tenant (or user), and never more than ``burst + rate * T`` counted from a
full bucket. The price is the other way round: tokens leased by one process and left
unspent when it goes idle are not available to the others until the bucket refills.

A refusal is cached in the process until the bucket could hold a token again (at most
one second), so a flood of refused requests does not reach the database either.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gateway.ratelimit.store import TakeRequest, Taken, TokenStore

log = structlog.get_logger("gateway.ratelimit")

LEASE_TTL_S = 1.0
MAX_LEASE = 100
DENIAL_CACHE_S = 1.0
MAX_ATTEMPTS = 20
RETRY_SOON_S = 1.0


@dataclass(frozen=True, slots=True)
class Limit:
    rate: float
    """Tokens per second."""
    burst: int
    """Most tokens a bucket holds."""

    @classmethod
    def from_settings(cls, rate: float, burst: int) -> Limit | None:
        """``None`` (no limit) for a rate of 0; a burst of 0 means one second's worth."""
        if rate <= 0:
            return None
        return cls(rate=rate, burst=burst if burst > 0 else max(1, math.ceil(rate)))


def lease_cap(rate: float, burst: float) -> int:
    return int(max(1, min(MAX_LEASE, max(burst / 10, rate / 20))))


class RateLimited(Exception):
    def __init__(self, retry_after_s: float, scope: str) -> None:
        self.retry_after_s = retry_after_s
        self.scope = scope
        super().__init__(f"rate limited ({scope})")

    @property
    def retry_after(self) -> int:
        """Whole seconds for a ``Retry-After`` header, at least 1."""
        return max(1, math.ceil(self.retry_after_s))


class _Share:
    """This process's share of one bucket: the tokens it leased and not yet spent."""

    __slots__ = (
        "tenant_id", "user_id", "scope", "limit", "cap", "tokens", "expires", "chunk", "leased_at",
        "denied_until", "retry_at", "lease", "waiting",
    )

    def __init__(self, tenant_id: str, user_id: str, limit: Limit) -> None:
        self.tenant_id = tenant_id
        self.user_id = user_id
        self.scope = "user" if user_id else "tenant"
        self.limit = limit
        self.cap = lease_cap(limit.rate, limit.burst)
        self.tokens = 0
        self.expires = 0.0
        self.chunk = 1
        self.leased_at = -math.inf
        self.denied_until = 0.0
        self.retry_at = 0.0
        self.lease: asyncio.Task[None] | None = None
        self.waiting = 0

    def drop_expired(self) -> None:
        self.tokens = 0
        self.chunk = max(1, self.chunk // 2)

    def want(self, now: float) -> int:
        if now - self.leased_at < LEASE_TTL_S / 2:
            self.chunk = self.chunk * 2
        self.chunk = min(self.cap, self.chunk)
        return min(self.cap, max(self.chunk, self.waiting))

    def apply(self, taken: Taken, now: float) -> None:
        self.cap = lease_cap(taken.rate, taken.burst)
        if taken.granted:
            if self.expires <= now:
                self.tokens = 0
            self.tokens += taken.granted
            self.expires = now + LEASE_TTL_S
            self.leased_at = now
            self.denied_until = 0.0
        else:
            self.retry_at = now + taken.wait_s
            self.denied_until = now + min(taken.wait_s, DENIAL_CACHE_S)


class RateLimiter:
    def __init__(
        self,
        store: TokenStore,
        *,
        tenant: Limit | None,
        user: Limit | None,
        clock: Callable[[], float] = time.monotonic,
        max_shares: int = 100_000,
    ) -> None:
        self._store = store
        self._tenant = tenant
        self._user = user
        self._clock = clock
        self._max_shares = max_shares
        self._shares: dict[tuple[str, str], _Share] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def check(self, tenant_id: str, user_id: str) -> None:
        """Spend one token of the tenant's and of the user's bucket, or raise ``RateLimited``."""
        shares = self._shares_for(tenant_id, user_id)
        for _ in range(MAX_ATTEMPTS):
            now = self._clock()
            lacking: list[_Share] | None = None
            for share in shares:
                if share.tokens >= 1:
                    if share.expires > now:
                        continue
                    share.drop_expired()
                if share.denied_until > now:
                    raise RateLimited(share.retry_at - now, share.scope)
                if lacking is None:
                    lacking = [share]
                else:
                    lacking.append(share)
            if lacking is None:
                for share in shares:
                    share.tokens -= 1
                    if share.chunk >= 4 and share.tokens <= share.chunk >> 2 and share.lease is None:
                        self._start_lease([share], now)
                return
            await self._refill(lacking, now)
        raise RateLimited(RETRY_SOON_S, lacking[0].scope if lacking else "tenant")

    def _shares_for(self, tenant_id: str, user_id: str) -> list[_Share]:
        # Tenant first, then user: every lease locks buckets in the same order.
        shares = []
        if self._tenant is not None:
            shares.append(self._share(tenant_id, "", self._tenant))
        if self._user is not None:
            shares.append(self._share(tenant_id, user_id, self._user))
        return shares

    def _share(self, tenant_id: str, user_id: str, limit: Limit) -> _Share:
        key = (tenant_id, user_id)
        share = self._shares.get(key)
        if share is None:
            if len(self._shares) >= self._max_shares:
                self._shares.clear()
            share = self._shares[key] = _Share(tenant_id, user_id, limit)
        return share

    async def _refill(self, lacking: list[_Share], now: float) -> None:
        for share in lacking:
            share.waiting += 1
        try:
            idle = [share for share in lacking if share.lease is None]
            if idle:
                self._start_lease(idle, now)
            leases = {share.lease for share in lacking if share.lease is not None}
            # wait() rather than await: a cancelled request must not cancel a lease others wait on.
            await asyncio.wait(leases)
        finally:
            for share in lacking:
                share.waiting -= 1
        for lease in leases:
            error = lease.exception()
            if error is not None:
                raise error

    def _start_lease(self, shares: list[_Share], now: float) -> None:
        requests = [
            TakeRequest(s.tenant_id, s.user_id, s.limit.rate, float(s.limit.burst), s.want(now)) for s in shares
        ]
        task = asyncio.create_task(self._lease(shares, requests))
        for share in shares:
            share.lease = task
        self._tasks.add(task)
        task.add_done_callback(self._lease_done)

    async def _lease(self, shares: list[_Share], requests: list[TakeRequest]) -> None:
        try:
            taken = await self._store.take(requests)
        finally:
            for share in shares:
                share.lease = None
        now = self._clock()
        for share, result in zip(shares, taken, strict=True):
            share.apply(result, now)

    def _lease_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Waiting requests re-raise it (and answer 503); a background top-up only logs it.
            log.warning("rate_limit_lease_failed", error_type=type(task.exception()).__name__)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
