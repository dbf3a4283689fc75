"""Group commit for the hot path: concurrent requests' work goes to the database together.

Each caller submits one item and awaits its result. A lane sends what has queued as one
statement; while that statement is in flight, new items queue and go together in the
next one. A lone request is sent at once (no timer, no added latency), and under load
the cost of a round trip, a statement and a commit is shared by every request in the
batch. If the statement fails, every item of that batch gets the exception.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class StatementBatcher(Generic[Item, Result]):
    def __init__(
        self,
        execute: Callable[[Sequence[Item]], Awaitable[Sequence[Result]]],
        *,
        lanes: int = 2,
        max_items: int = 64,
    ) -> None:
        self._execute = execute
        self._lanes = lanes
        self._max_items = max_items
        self._queue: deque[tuple[Item, asyncio.Future[Result]]] = deque()
        self._busy_lanes = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._busy_lanes < self._lanes:
            self._busy_lanes += 1
            task = asyncio.create_task(self._lane())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _lane(self) -> None:
        try:
            while self._queue:
                batch = []
                while self._queue and len(batch) < self._max_items:
                    batch.append(self._queue.popleft())
                live = [(item, future) for item, future in batch if not future.cancelled()]
                if not live:
                    continue
                try:
                    results = await self._execute([item for item, _ in live])
                except BaseException as exc:  # every waiter learns what happened to its statement
                    for _, future in live:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_, future), result in zip(live, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._busy_lanes -= 1

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
