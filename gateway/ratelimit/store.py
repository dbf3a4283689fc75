"""The shared token buckets in the database: refill, then take up to what is asked.

One ``take`` is one round trip whatever the number of buckets (PostgreSQL: the
``gateway_take_tokens`` function of migration 0004; SQLite: the same steps in Python in
one ``BEGIN IMMEDIATE`` transaction). Each bucket holds at most ``burst`` tokens and
gains ``rate`` per second; a tenant's override, when one exists, replaces both.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.db.models import RateLimitBucket, RateLimitOverride


@dataclass(frozen=True, slots=True)
class TakeRequest:
    tenant_id: str
    user_id: str
    """``""`` for the tenant's own bucket."""
    rate: float
    burst: float
    want: int


@dataclass(frozen=True, slots=True)
class Taken:
    granted: int
    wait_s: float
    """When nothing was granted: seconds until the bucket holds one token again."""
    rate: float
    burst: float
    """The bucket's effective rate and burst (a tenant's override, or the configured ones)."""


class TokenStore(ABC):
    @abstractmethod
    async def take(self, requests: Sequence[TakeRequest], *, now: datetime | None = None) -> list[Taken]:
        """Take from each bucket, in one round trip; ``now`` defaults to the database's clock."""


class PostgresTokenStore(TokenStore):
    TAKE = "SELECT o_granted, o_wait_s, o_rate, o_burst FROM gateway_take_tokens($1, $2, $3, $4, $5, $6)"

    def __init__(self, db: Database) -> None:
        self._db = db

    async def take(self, requests: Sequence[TakeRequest], *, now: datetime | None = None) -> list[Taken]:
        async with self._db.driver() as conn:
            rows = await conn.fetch(
                self.TAKE,
                [r.tenant_id for r in requests],
                [r.user_id for r in requests],
                [float(r.rate) for r in requests],
                [float(r.burst) for r in requests],
                [r.want for r in requests],
                now,
            )
        return [Taken(granted=row[0], wait_s=row[1], rate=row[2], burst=row[3]) for row in rows]


_buckets = RateLimitBucket.__table__
_overrides = RateLimitOverride.__table__


class SqliteTokenStore(TokenStore):
    def __init__(self, db: Database) -> None:
        self._db = db

    async def take(self, requests: Sequence[TakeRequest], *, now: datetime | None = None) -> list[Taken]:
        now = now or datetime.now(UTC)
        taken = []
        async with self._db.begin() as conn:
            for request in requests:
                rate, burst = request.rate, request.burst
                override = (
                    await conn.execute(
                        sa.select(_overrides.c.rate_per_s, _overrides.c.burst).where(
                            _overrides.c.tenant_id == request.tenant_id,
                            _overrides.c.scope == ("tenant" if request.user_id == "" else "user"),
                        )
                    )
                ).first()
                if override is not None:
                    rate, burst = float(override[0]), float(override[1])
                where = (_buckets.c.tenant_id == request.tenant_id, _buckets.c.user_id == request.user_id)
                row = (await conn.execute(sa.select(_buckets.c.tokens, _buckets.c.updated_at).where(*where))).first()
                if row is None:
                    tokens, updated = burst, now
                else:
                    tokens, updated = float(row[0]), row[1]
                elapsed = max(0.0, (now - updated).total_seconds())
                tokens = min(burst, tokens + rate * elapsed)
                granted = max(0, min(request.want, math.floor(tokens)))
                tokens -= granted
                values = {"tokens": tokens, "updated_at": max(updated, now)}
                if row is None:
                    await conn.execute(
                        _buckets.insert().values(tenant_id=request.tenant_id, user_id=request.user_id, **values)
                    )
                else:
                    await conn.execute(_buckets.update().where(*where).values(**values))
                wait_s = 0.0 if granted else (1 - tokens) / rate
                taken.append(Taken(granted=granted, wait_s=wait_s, rate=rate, burst=burst))
        return taken


def create_token_store(db: Database) -> TokenStore:
    return PostgresTokenStore(db) if db.is_postgres else SqliteTokenStore(db)
