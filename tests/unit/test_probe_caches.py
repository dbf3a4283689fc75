"""Unauthenticated probes cannot make the database work: /readyz and /metrics' database gauges
ask it at most once per second per process (a fake clock here, nothing waits)."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

from gateway.api.health import Readiness
from gateway.api.metrics import DatabaseGauges


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingDatabase:
    """Counts what reaches the database; ``up`` decides whether it answers."""

    def __init__(self, *, up: bool = True) -> None:
        self.up = up
        self.queries = 0

    async def ping(self) -> None:
        self.queries += 1
        await asyncio.sleep(0)
        if not self.up:
            raise ConnectionRefusedError("down")

    @asynccontextmanager
    async def connect(self) -> Any:
        self.queries += 1
        await asyncio.sleep(0)
        if not self.up:
            raise ConnectionRefusedError("down")
        yield _NoRows()


class _NoRows:
    async def execute(self, query: Any) -> Any:
        return self

    def all(self) -> list[Any]:
        return [("acme", 2)]


async def test_readiness_asks_the_database_once_per_second_however_many_probes() -> None:
    db, clock = CountingDatabase(), Clock()
    readiness = Readiness(db, clock=clock)  # type: ignore[arg-type]
    assert all(await asyncio.gather(*(readiness.ready() for _ in range(50))))
    assert db.queries == 1
    clock.now += 0.999
    assert await readiness.ready()
    assert db.queries == 1
    clock.now += 0.001
    assert await readiness.ready()
    assert db.queries == 2


async def test_readiness_remembers_a_failure_for_the_second_too_and_then_asks_again() -> None:
    db, clock = CountingDatabase(up=False), Clock()
    readiness = Readiness(db, clock=clock)  # type: ignore[arg-type]
    assert not any([await readiness.ready() for _ in range(10)])
    assert db.queries == 1
    db.up = True
    clock.now += 1.0
    assert await readiness.ready()
    assert db.queries == 2


async def test_metrics_gauges_are_read_once_per_second_unless_fresh_is_asked() -> None:
    db, clock = CountingDatabase(), Clock()
    gauges = DatabaseGauges(db, clock=clock)  # type: ignore[arg-type]
    answers = await asyncio.gather(*(gauges.pending() for _ in range(20)))
    assert answers == [{"acme": 2}] * 20
    assert db.queries == 1
    assert await gauges.pending(fresh=True) == {"acme": 2}
    assert db.queries == 2
    clock.now += 1.0
    await gauges.pending()
    assert db.queries == 3


async def test_metrics_gauges_of_a_database_that_is_down_are_none() -> None:
    db, clock = CountingDatabase(up=False), Clock()
    gauges = DatabaseGauges(db, clock=clock)  # type: ignore[arg-type]
    assert await gauges.pending() is None
    assert await gauges.pending() is None
    assert db.queries == 1
