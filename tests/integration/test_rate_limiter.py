"""Rate limits: shared buckets in the database, leased in chunks, spent in the process."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.db.models import RateLimitOverride
from gateway.ratelimit.limiter import Limit, RateLimited, RateLimiter, lease_cap
from gateway.ratelimit.store import TakeRequest, Taken, TokenStore, create_token_store

ALMOST_NO_REFILL = 0.001
"""Tokens per second: nothing refills during a test, so what a bucket admits is its burst."""


class CountingStore(TokenStore):
    """The real store, counting its round trips."""

    def __init__(self, inner: TokenStore) -> None:
        self.inner = inner
        self.round_trips = 0

    async def take(self, requests: Sequence[TakeRequest], *, now: datetime | None = None) -> list[Taken]:
        self.round_trips += 1
        return await self.inner.take(requests, now=now)


async def admitted(limiter: RateLimiter, tenant: str, user: str, attempts: int) -> tuple[int, list[RateLimited]]:
    results = await asyncio.gather(*(limiter.check(tenant, user) for _ in range(attempts)), return_exceptions=True)
    refusals = [r for r in results if isinstance(r, RateLimited)]
    assert all(r is None or isinstance(r, RateLimited) for r in results), results
    return attempts - len(refusals), refusals


async def test_user_burst_is_admitted_then_refused_with_a_retry_after(db: Database) -> None:
    limiter = RateLimiter(create_token_store(db), tenant=None, user=Limit(rate=ALMOST_NO_REFILL, burst=5))
    for _ in range(5):
        await limiter.check("acme", "alice")
    with pytest.raises(RateLimited) as refused:
        await limiter.check("acme", "alice")
    assert refused.value.scope == "user"
    assert refused.value.retry_after >= 1
    await limiter.check("acme", "bob")  # another user has a bucket of their own
    await limiter.close()


async def test_tenant_limit_covers_all_its_users(db: Database) -> None:
    limiter = RateLimiter(
        create_token_store(db), tenant=Limit(rate=ALMOST_NO_REFILL, burst=3), user=Limit(rate=1000, burst=1000)
    )
    for user in ("alice", "bob", "carol"):
        await limiter.check("acme", user)
    with pytest.raises(RateLimited) as refused:
        await limiter.check("acme", "dave")
    assert refused.value.scope == "tenant"
    await limiter.check("globex", "alice")
    await limiter.close()


async def test_concurrent_requests_never_exceed_the_burst(db: Database) -> None:
    limiter = RateLimiter(create_token_store(db), tenant=None, user=Limit(rate=ALMOST_NO_REFILL, burst=10))
    count, refusals = await admitted(limiter, "acme", "alice", 50)
    assert count == 10
    assert len(refusals) == 40
    await limiter.close()


async def test_two_processes_share_one_bucket(db: Database) -> None:
    limit = Limit(rate=ALMOST_NO_REFILL, burst=40)
    first = RateLimiter(create_token_store(db), tenant=None, user=limit)
    second = RateLimiter(create_token_store(db), tenant=None, user=limit)
    (a, _), (b, _) = await asyncio.gather(
        admitted(first, "acme", "alice", 60), admitted(second, "acme", "alice", 60)
    )
    # Never more than the bucket held; at most the unspent leases of each process less.
    assert a + b <= 40
    assert a + b >= 40 - 2 * int(1.25 * lease_cap(limit.rate, limit.burst))
    await first.close()
    await second.close()


async def test_most_requests_are_admitted_without_a_database_round_trip(db: Database) -> None:
    store = CountingStore(create_token_store(db))
    limiter = RateLimiter(store, tenant=Limit(rate=10_000, burst=10_000), user=Limit(rate=10_000, burst=10_000))
    for _ in range(1000):
        await limiter.check("acme", "alice")
    await limiter.close()
    assert store.round_trips <= 60, store.round_trips


async def test_a_tenant_override_replaces_the_configured_limit(db: Database) -> None:
    async with db.begin() as conn:
        await conn.execute(
            sa.insert(RateLimitOverride).values(tenant_id="globex", scope="user", rate_per_s=ALMOST_NO_REFILL, burst=2)
        )
    limiter = RateLimiter(create_token_store(db), tenant=None, user=Limit(rate=1000, burst=1000))
    count, _ = await admitted(limiter, "globex", "alice", 10)
    assert count == 2
    count, _ = await admitted(limiter, "acme", "alice", 10)
    assert count == 10
    await limiter.close()


async def test_a_bucket_refills_at_its_rate_up_to_its_burst(db: Database) -> None:
    store = create_token_store(db)
    start = datetime(2026, 1, 1, tzinfo=UTC)

    async def take(want: int, after_s: float) -> Taken:
        request = TakeRequest("acme", "alice", rate=2.0, burst=10.0, want=want)
        return (await store.take([request], now=start + timedelta(seconds=after_s)))[0]

    assert (await take(100, 0)).granted == 10
    empty = await take(1, 0)
    assert empty.granted == 0
    assert empty.wait_s == pytest.approx(0.5)
    assert (await take(100, 1.5)).granted == 3  # 1.5 s at 2 tokens/s
    assert (await take(100, 100)).granted == 10  # never more than the burst


def test_limits_of_zero_mean_no_limit_and_a_burst_of_zero_means_one_second() -> None:
    assert Limit.from_settings(0, 100) is None
    assert Limit.from_settings(2.5, 0) == Limit(rate=2.5, burst=3)
    assert Limit.from_settings(5, 20) == Limit(rate=5, burst=20)


async def test_buckets_are_read_by_key_even_when_planned_while_the_tables_were_small(db: Database) -> None:
    # A session keeps the function's plans; one made on a nearly empty table may scan it, and
    # would go on scanning it on that connection as the buckets grow with the users.
    async with db.begin() as conn:
        await conn.execute(sa.insert(RateLimitOverride).values(tenant_id="acme", scope="user", rate_per_s=5, burst=5))
    take = "SELECT count(*) FROM gateway_take_tokens($1, $2, $3, $4, $5, NULL)"
    scanned = ("SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables "
               "WHERE relname IN ('rate_limit_buckets', 'rate_limit_overrides')")
    async with db.driver() as conn:
        async with conn.transaction():
            before = await conn.fetchval(scanned)
            for _ in range(3):  # creates the buckets, then takes from them
                await conn.fetchval(take, ["acme", "acme", "globex"], ["", "alice", "bob"], [1.0] * 3, [5.0] * 3, [1] * 3)
            assert await conn.fetchval(scanned) - before == 0
