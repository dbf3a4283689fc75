"""Tenants and their role→permission maps, cached for a few seconds in each process.

The database stays the source of truth; a change made by an admin (or on another gateway
process) is seen here within ``GATEWAY_POLICY_CACHE_S`` seconds.
"""

from __future__ import annotations

import asyncio
import time

from gateway.db.engine import Database
from gateway.db.tenants import TenantRecord, load_tenant


class TenantDirectory:
    def __init__(self, db: Database, *, ttl_s: float) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._entries: dict[str, tuple[float, TenantRecord | None]] = {}
        self._loading: dict[str, asyncio.Future[TenantRecord | None]] = {}

    async def get(self, tenant_id: str) -> TenantRecord | None:
        entry = self._entries.get(tenant_id)
        if entry is not None and time.monotonic() - entry[0] < self._ttl_s:
            return entry[1]
        pending = self._loading.get(tenant_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[TenantRecord | None] = asyncio.get_running_loop().create_future()
        self._loading[tenant_id] = future
        try:
            async with self._db.connect() as conn:
                record = await load_tenant(conn, tenant_id=tenant_id)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            self._loading.pop(tenant_id, None)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[tenant_id] = (time.monotonic(), record)
        future.set_result(record)
        return record

    def invalidate(self, tenant_id: str | None = None) -> None:
        if tenant_id is None:
            self._entries.clear()
        else:
            self._entries.pop(tenant_id, None)

    @staticmethod
    def permissions_for(record: TenantRecord, roles: frozenset[str]) -> frozenset[str]:
        granted: set[str] = set()
        for role in roles:
            granted |= record.role_permissions.get(role, frozenset())
        return frozenset(granted)
