"""Outbound requests take turns per tenant.

A model answer holds its connection for the whole answer (up to the model's timeout), and so
does a call to a slow business service or MCP server: a tenant that starts a hundred of them
at once would otherwise hold every connection of the pool they share, and every other
tenant's requests would wait behind them. Each tenant has at most ``per_tenant`` requests of
one kind in flight in a process (one ``TenantTurns`` per kind: model requests, and calls of
remote tools); its further requests wait their turn (within their own time limit), and other
tenants' requests go on.
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
