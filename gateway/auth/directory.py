"""Tenants and their role→permission maps, cached for a few seconds in each process.

The database stays the source of truth; a change made by an admin (or on another gateway
process) is seen here within ``GATEWAY_POLICY_CACHE_S`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.db.tenants import TenantRecord, load_tenant

@dataclass(slots=True)
class _Entry:
    loaded_at: float
    record: TenantRecord | None
    principals: dict[tuple[str, tuple[str, ...]], Principal] = field(default_factory=dict)


class TenantDirectory:
    def __init__(self, db: Database, *, ttl_s: float) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._entries: dict[str, _Entry] = {}
        self._loading: dict[str, asyncio.Future[_Entry]] = {}

    async def get(self, tenant_id: str) -> TenantRecord | None:
        return (await self._entry(tenant_id)).record

    def cached_principal(self, tenant_id: str, user_id: str, roles: list[str]) -> Principal | None:
        """The principal when the tenant's entry is fresh and already knows it, without awaiting."""
        entry = self._fresh(tenant_id)
        if entry is None or entry.record is None:
            return None
        return entry.principals.get((user_id, tuple(roles)))

    async def principal(self, tenant_id: str, user_id: str, roles: list[str]) -> Principal | None:
        """The caller as the tenant's current policy sees them; None for an unknown tenant.

        Principals are kept with the tenant's cache entry, so a client sending the same
        token again costs a dictionary lookup, and a policy change is seen on the next load.
        """
        entry = await self._entry(tenant_id)
        if entry.record is None:
            return None
        key = (user_id, tuple(roles))
        principal = entry.principals.get(key)
        if principal is None:
            role_set = frozenset(roles)
            principal = Principal(
                tenant_id=entry.record.id,
                user_id=user_id,
                roles=role_set,
                permissions=self.permissions_for(entry.record, role_set),
                tool_policies=entry.record.tool_policies,
            )
            if len(entry.principals) > 10_000:
                entry.principals.clear()
            entry.principals[key] = principal
        return principal

    def is_disabled(self, tenant_id: str) -> bool:
        entry = self._entries.get(tenant_id)
        return entry is not None and entry.record is not None and entry.record.disabled

    def _fresh(self, tenant_id: str) -> _Entry | None:
        entry = self._entries.get(tenant_id)
        if entry is not None and time.monotonic() - entry.loaded_at < self._ttl_s:
            return entry
        return None

    async def _entry(self, tenant_id: str) -> _Entry:
        entry = self._fresh(tenant_id)
        if entry is not None:
            return entry
        pending = self._loading.get(tenant_id)
        if pending is None:
            # A task of its own, shared by every caller waiting for this tenant: one caller
            # cancelled (its client gone, shutdown) must not cancel the others' load.
            pending = asyncio.ensure_future(self._load(tenant_id))
            self._loading[tenant_id] = pending
            pending.add_done_callback(lambda task: self._loaded(tenant_id, task))
        return await asyncio.shield(pending)

    async def _load(self, tenant_id: str) -> _Entry:
        async with self._db.connect() as conn:
            record = await load_tenant(conn, tenant_id=tenant_id)
        if len(self._entries) > 10_000:
            self._entries.clear()
        entry = _Entry(loaded_at=time.monotonic(), record=record)
        self._entries[tenant_id] = entry
        return entry

    def _loaded(self, tenant_id: str, task: asyncio.Future[_Entry]) -> None:
        if self._loading.get(tenant_id) is task:
            del self._loading[tenant_id]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters re-raise it; with none left, nobody must

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
