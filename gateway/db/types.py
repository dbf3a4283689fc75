"""Column types that behave the same on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite.

    SQLite has no time zones; storing naive UTC keeps comparisons and ordering correct there.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.DateTime(timezone=False))
        return dialect.type_descriptor(sa.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JsonValue = sa.JSON().with_variant(JSONB(), "postgresql")
"""JSON on SQLite, JSONB on PostgreSQL."""

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A 64-bit surrogate key; on SQLite the INTEGER PRIMARY KEY rowid."""


def utcnow() -> datetime:
    return datetime.now(UTC)
