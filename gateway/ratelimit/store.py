"""The shared token buckets in the database: refill, then take up to what is asked.

One ``take`` is one round trip whatever the number of buckets (the ``gateway_take_tokens``
function, ``gateway/db/sql/take_tokens.sql``). Each bucket holds at most ``burst`` tokens and
gains ``rate`` per second; a tenant's override, when one exists, replaces both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gateway.db.engine import Database


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


def create_token_store(db: Database) -> TokenStore:
    return PostgresTokenStore(db)
