"""Column types of the models."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp (``timestamptz``); a naive datetime is refused."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JsonValue = JSONB()

BigIntId = sa.BigInteger()
"""A 64-bit surrogate key."""


def utcnow() -> datetime:
    return datetime.now(UTC)
