"""Model requests take turns per tenant.

A chat holds its model connection for the whole answer (up to the model's timeout): a tenant
that starts a hundred slow chats at once would otherwise hold every connection of the model
providers' pool, and every other tenant's chats would wait behind them. Each tenant has at
most ``per_tenant`` model requests in flight in a process; its further requests wait their
turn (within their run's time limit), and other tenants' requests go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TenantTurns:
    def __init__(self, per_tenant: int) -> None:
        self._per_tenant = per_tenant
        self._lanes: dict[str, asyncio.Semaphore] = {}
        self._holders: dict[str, int] = {}

    @asynccontextmanager
    async def turn(self, tenant_id: str) -> AsyncIterator[None]:
        """Hold one of the tenant's turns for the block (waiting for one if all are taken)."""
        lane = self._lanes.get(tenant_id)
        if lane is None:
            lane = self._lanes[tenant_id] = asyncio.Semaphore(self._per_tenant)
        self._holders[tenant_id] = self._holders.get(tenant_id, 0) + 1
        try:
            async with lane:
                yield
        finally:
            left = self._holders[tenant_id] - 1
            if left:
                self._holders[tenant_id] = left
            else:  # no one holds or waits: the tenant's lane goes (the dict does not grow with tenants seen)
                del self._holders[tenant_id]
                del self._lanes[tenant_id]

    @property
    def tenants(self) -> int:
        return len(self._lanes)
