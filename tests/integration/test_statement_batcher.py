"""Group commit: one bad member of a grouped statement fails only its own request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from gateway.db.batching import StatementBatcher


@pytest.fixture
async def pool(pg_url: str) -> AsyncIterator[asyncpg.Pool]:
    created = await asyncpg.create_pool(pg_url.replace("postgresql+asyncpg://", "postgresql://", 1),
                                        min_size=1, max_size=2)
    try:
        await created.execute("CREATE TABLE batched (value text NOT NULL)")
        yield created
    finally:
        await created.close()


class Inserts:
    """One INSERT of every item's text: PostgreSQL refuses the whole statement if one holds NUL."""

    def __init__(self) -> None:
        self.statements: list[list[str]] = []

    async def __call__(self, conn: Any, items: Sequence[str]) -> list[str]:
        self.statements.append(list(items))
        rows = await conn.fetch("INSERT INTO batched (value) SELECT unnest($1::text[]) RETURNING value", list(items))
        return [row["value"] for row in rows]


async def test_a_member_postgres_refuses_fails_alone_and_the_others_are_stored(pool):
    inserts = Inserts()

    async def provide() -> asyncpg.Pool:
        return pool

    batcher: StatementBatcher[str, str] = StatementBatcher(inserts, pool=provide, lanes=1)
    items = [f"item-{i}" for i in range(20)]
    items[7] = "divide\u0000"
    try:
        results = await asyncio.gather(*(batcher.submit(item) for item in items), return_exceptions=True)
    finally:
        await batcher.close()

    assert any(len(s) > 1 and "divide\u0000" in s for s in inserts.statements)  # it was grouped with others
    failed = [item for item, result in zip(items, results, strict=True) if isinstance(result, BaseException)]
    assert failed == ["divide\u0000"]
    assert isinstance(results[7], asyncpg.PostgresError)
    assert [r for i, r in enumerate(results) if i != 7] == [item for i, item in enumerate(items) if i != 7]
    stored = sorted(row["value"] for row in await pool.fetch("SELECT value FROM batched"))
    assert stored == sorted(item for i, item in enumerate(items) if i != 7)  # each exactly once


async def test_a_member_that_cannot_even_be_encoded_fails_alone(pool):
    inserts = Inserts()

    async def provide() -> asyncpg.Pool:
        return pool

    batcher: StatementBatcher[str, str] = StatementBatcher(inserts, pool=provide, lanes=1)
    items = ["a", "lone \ud800 surrogate", "b"]
    try:
        results = await asyncio.gather(*(batcher.submit(item) for item in items), return_exceptions=True)
    finally:
        await batcher.close()
    assert results[0] == "a" and results[2] == "b"
    assert isinstance(results[1], Exception)
