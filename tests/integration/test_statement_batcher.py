"""Group commit: one bad member of a grouped statement fails only its own request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from gateway.db.batching import BatcherClosed, StatementBatcher


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


class Traced:
    """Inserts every item's text, noting which server process (which lane's connection) sent
    each statement; an item "sleep" makes its statement last a while, an item "locked" makes
    it wait for the row of ``gate`` another session holds."""

    def __init__(self) -> None:
        self.statements: list[tuple[int, list[str]]] = []

    async def __call__(self, conn: Any, items: Sequence[str]) -> list[str]:
        self.statements.append((conn.get_server_pid(), list(items)))
        if "sleep" in items:
            await conn.execute("SELECT pg_sleep(0.5)")
        if "locked" in items:
            await conn.execute("SELECT 1 FROM gate WHERE id = 1 FOR UPDATE")
        rows = await conn.fetch("INSERT INTO batched (value) SELECT unnest($1::text[]) RETURNING value", list(items))
        return [row["value"] for row in rows]


def traced_batcher(
    pool: asyncpg.Pool, traced: Traced, *, overflow_after_s: float, lanes: int = 2, max_items: int = 64
) -> StatementBatcher[str, str]:
    async def provide() -> asyncpg.Pool:
        return pool

    return StatementBatcher(traced, pool=provide, lanes=lanes, max_items=max_items, overflow_after_s=overflow_after_s)


async def in_flight(traced: Traced, count: int) -> None:
    while len(traced.statements) < count:
        await asyncio.sleep(0.01)


async def first_lane_sent(batcher: StatementBatcher[str, str], traced: Traced, item: str) -> asyncio.Task[str]:
    """``item`` submitted alone and its statement on its way: the first lane is busy with it."""
    task = asyncio.create_task(batcher.submit(item))
    await in_flight(traced, 1)
    return task


@contextlib.asynccontextmanager
async def gate_held(pool: asyncpg.Pool, pg_url: str) -> AsyncIterator[asyncpg.transaction.Transaction]:
    """Another session holds the row of ``gate`` locked until the transaction yielded ends."""
    await pool.execute("CREATE TABLE gate (id integer PRIMARY KEY); INSERT INTO gate VALUES (1)")
    holder = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT 1 FROM gate WHERE id = 1 FOR UPDATE")
        yield transaction
    finally:
        await holder.close()


async def test_requests_gather_behind_the_first_lane_while_its_statement_runs(pool):
    traced = Traced()
    batcher = traced_batcher(pool, traced, overflow_after_s=30)
    try:
        slow = await first_lane_sent(batcher, traced, "sleep")
        items = [f"item-{i}" for i in range(8)]
        assert await asyncio.gather(*(batcher.submit(item) for item in items)) == items
        assert await slow == "sleep"
    finally:
        await batcher.close()
    # The second lane never sent: the eight waited for the first lane and went as one statement.
    assert [items_ for _, items_ in traced.statements] == [["sleep"], items]
    assert len({pid for pid, _ in traced.statements}) == 1


async def test_a_statement_waiting_on_a_lock_holds_the_others_up_only_until_the_next_lane_sends(pool, pg_url):
    traced = Traced()
    batcher = traced_batcher(pool, traced, overflow_after_s=0.05)
    try:
        async with gate_held(pool, pg_url) as lock:
            blocked = await first_lane_sent(batcher, traced, "locked")
            items = [f"item-{i}" for i in range(5)]
            # Served while the lock is still held: by the second lane, on its own connection.
            # 100 times the overflow wait: a lane that waited for the lock instead would not make it.
            assert await asyncio.wait_for(asyncio.gather(*(batcher.submit(item) for item in items)), 5) == items
            assert not blocked.done()
            await lock.rollback()
        assert await asyncio.wait_for(blocked, 20) == "locked"
    finally:
        await batcher.close()
    first_pid = traced.statements[0][0]
    assert all(pid != first_pid for pid, items_ in traced.statements[1:] if items_ != ["locked"])
    stored = sorted(row["value"] for row in await pool.fetch("SELECT value FROM batched"))
    assert stored == sorted([*items, "locked"])  # each exactly once


async def test_with_no_overflow_wait_every_lane_sends_whenever_it_is_free(pool):
    traced = Traced()
    batcher = traced_batcher(pool, traced, overflow_after_s=0)
    try:
        slow = await first_lane_sent(batcher, traced, "sleep")
        quick = asyncio.create_task(batcher.submit("quick"))
        done, _ = await asyncio.wait({slow, quick}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {quick}
        assert await slow == "sleep"
    finally:
        await batcher.close()
    assert traced.statements[0][0] != traced.statements[1][0]


async def test_when_more_wait_than_one_statement_takes_the_next_lane_sends_at_once(pool):
    traced = Traced()
    batcher = traced_batcher(pool, traced, overflow_after_s=30, max_items=2)
    try:
        slow = await first_lane_sent(batcher, traced, "sleep")
        items = [f"item-{i}" for i in range(4)]
        quick = asyncio.gather(*(batcher.submit(item) for item in items))
        done, _ = await asyncio.wait({slow, quick}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {quick}  # the second lane did not wait 30 s for the first
        assert quick.result() == items
        assert await slow == "sleep"
    finally:
        await batcher.close()
    first_pid = traced.statements[0][0]
    assert any(pid != first_pid for pid, _ in traced.statements[1:])
    assert all(len(items_) <= 2 for _, items_ in traced.statements)


async def test_closing_while_a_statement_waits_on_a_lock_answers_its_waiters(pool, pg_url):
    traced = Traced()
    batcher = traced_batcher(pool, traced, overflow_after_s=0.005, lanes=1)
    async with gate_held(pool, pg_url) as lock:
        blocked = await first_lane_sent(batcher, traced, "locked")
        await batcher.close(timeout_s=0.1)
        with pytest.raises(BatcherClosed):
            await asyncio.wait_for(blocked, 5)  # answered, not left waiting for ever
        await lock.rollback()
    assert await pool.fetchval("SELECT count(*) FROM batched") == 0
