"""Group commit for the hot path: concurrent requests' work goes to the database together.

Each caller submits one item and awaits its result. A few long-lived lanes, each holding
one connection, send what has queued as one statement; while that statement is in flight
new items queue and go together in the next one. A lone request is sent at once (no timer,
no added latency), and under load the cost of a round trip, a statement and a commit is
shared by every request in the batch.

One item must not fail the others: when a grouped statement is refused (the server
rejected it, or an item could not even be encoded), nothing of it was committed, so each
of its items is sent again on its own and only the item that is wrong gets the error.
When the connection itself failed, the outcome of the statement is unknown: every item
of the batch gets that error (it is never sent twice) and the lane takes a fresh
connection for the next one.

The first lane sends whenever it is free; every further lane is an overflow lane, which sends
only once each lane before it has been busy with its statement for ``overflow_after_s``
(or at once when more items wait than one statement takes). Statements normally take
about a millisecond, so under load requests gather behind the first lane in groups as
large as one lane makes them (each statement has a fixed cost of a few hundred
microseconds in PostgreSQL, paid once per group); a statement that waits on a lock (a
replay of a call whose transaction is still running, say) holds up the items queued
behind it only for ``overflow_after_s``, after which the next lane serves them. The items
grouped into the waiting statement wait with it.

Lanes keep their connection between statements: checking one out of asyncpg's pool and
back costs a task per release, which on this path was a measurable share of the CPU.
``close`` lets queued and in-flight work finish before it stops the lanes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import asyncpg
import structlog

log = structlog.get_logger("gateway.db")

Item = TypeVar("Item")
Result = TypeVar("Result")

Execute = Callable[[asyncpg.Connection, Sequence[Item]], Awaitable[Sequence[Result]]]


class BatcherClosed(Exception):
    """The process is shutting down and takes no new database work."""


class StatementBatcher(Generic[Item, Result]):
    def __init__(
        self,
        execute: Execute[Item, Result],
        *,
        pool: Callable[[], Awaitable[asyncpg.Pool]],
        lanes: int = 2,
        max_items: int = 64,
        overflow_after_s: float = 0.005,
        even_if_cancelled: bool = False,
    ) -> None:
        """``even_if_cancelled``: run an item whose caller stopped waiting (records that must
        land even when the request was cancelled), instead of dropping it.
        ``overflow_after_s``: how long every lane before an overflow lane must have been
        busy with one statement before it sends (0: every lane sends whenever it is free)."""
        self._execute = execute
        self._even_if_cancelled = even_if_cancelled
        self._pool = pool
        self._lane_count = lanes
        self._max_items = max_items
        self._overflow_after_s = overflow_after_s
        # When each lane's statement went out; None while the lane is free.
        self._busy_since: list[float | None] = [None] * lanes
        self._queue: deque[tuple[Item, asyncio.Future[Result]]] = deque()
        self._wake: asyncio.Event | None = None
        self._lanes: list[asyncio.Task[None]] = []
        self._in_flight = 0
        self._closing = False

    async def submit(self, item: Item) -> Result:
        if self._closing:
            raise BatcherClosed()
        if not self._lanes:
            self._start()
        assert self._wake is not None
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        self._wake.set()
        return await future

    def _start(self) -> None:
        self._wake = asyncio.Event()
        self._lanes = [
            asyncio.create_task(self._lane(index), name=f"statement-lane-{index}") for index in range(self._lane_count)
        ]

    def _overflow_wait_s(self, index: int) -> float:
        """How long lane ``index`` must still wait before it may send (0 when it may now)."""
        if index == 0 or self._overflow_after_s <= 0 or len(self._queue) >= self._max_items:
            return 0.0  # more wait than one statement takes: holding back would make no group larger
        now = asyncio.get_running_loop().time()
        wait_s = 0.0
        for lane, since in zip(self._lanes[:index], self._busy_since[:index], strict=True):
            if lane.done():  # a lane that ended sends nothing: never wait for it
                continue
            if since is None:  # a lane before it is free and takes the queue: look again later
                return self._overflow_after_s
            wait_s = max(wait_s, since + self._overflow_after_s - now)
        return wait_s

    async def _lane(self, index: int) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        pool: asyncpg.Pool | None = None
        conn: Any = None
        try:
            try:  # at once, so that an overflow lane's first statement does not wait for a connection
                pool = await self._pool()
                conn = await pool.acquire()
            except Exception:  # the first statement tries again, and its waiters learn why it failed
                conn = None
            while True:
                while not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                wait_s = self._overflow_wait_s(index)
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                    continue
                batch = []
                while self._queue and len(batch) < self._max_items:
                    item, future = self._queue.popleft()
                    if self._even_if_cancelled or not future.cancelled():
                        batch.append((item, future))
                if not batch:
                    continue
                self._in_flight += 1
                self._busy_since[index] = loop.time()
                try:
                    if conn is None:
                        pool = await self._pool()
                        conn = await pool.acquire()
                    if not await self._send(conn, batch):
                        assert pool is not None
                        await _release(pool, conn)  # it broke: the next batch takes a fresh one
                        conn = None
                except Exception as exc:  # no connection: every waiter learns why
                    _fail(batch, exc)
                    if conn is not None and pool is not None:
                        await _release(pool, conn)
                    conn = None
                except asyncio.CancelledError:  # stopped by close(): no waiter is left hanging
                    _fail(batch, BatcherClosed())
                    raise
                finally:
                    self._in_flight -= 1
                    self._busy_since[index] = None
        finally:
            if conn is not None and pool is not None:
                await _release(pool, conn)

    async def _send(self, conn: Any, batch: list[tuple[Item, asyncio.Future[Result]]]) -> bool:
        """Run ``batch`` as one statement, or item by item when that statement is refused.
        False when the connection broke."""
        try:
            results = await self._execute(conn, [item for item, _ in batch])
        except Exception as exc:
            if _connection_failed(exc) or len(batch) == 1:
                _fail(batch, exc)
                return not _connection_failed(exc)
            log.warning("grouped_statement_refused", items=len(batch), error=type(exc).__name__)
            for index, single in enumerate(batch):
                try:
                    results = await self._execute(conn, [single[0]])
                except Exception as single_exc:
                    if _connection_failed(single_exc):
                        _fail(batch[index:], single_exc)
                        return False
                    _fail([single], single_exc)
                else:
                    _succeed([single], results)
            return True
        _succeed(batch, results)
        return True

    async def close(self, *, timeout_s: float = 10.0) -> None:
        """Finish what is queued or in flight (within ``timeout_s``), then stop the lanes."""
        self._closing = True
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (self._queue or self._in_flight) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        for lane in self._lanes:
            lane.cancel()
        if self._lanes:
            await asyncio.gather(*self._lanes, return_exceptions=True)
        for _, future in self._queue:
            if not future.done():
                future.set_exception(BatcherClosed())
        self._queue.clear()
        self._lanes = []


def _succeed(batch: Sequence[tuple[Any, asyncio.Future[Any]]], results: Sequence[Any]) -> None:
    for (_, future), result in zip(batch, results, strict=True):
        if not future.done():
            future.set_result(result)


def _fail(batch: Sequence[tuple[Any, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)


def _connection_failed(exc: BaseException) -> bool:
    """The connection broke (or the server is going away): what the statement did is unknown."""
    return isinstance(exc, (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                            asyncpg.exceptions.OperatorInterventionError))


async def _release(pool: asyncpg.Pool, conn: Any) -> None:
    try:
        await pool.release(conn)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        conn.terminate()
