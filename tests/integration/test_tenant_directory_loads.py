"""The tenant directory loads a tenant once for every caller waiting on it: one caller
cancelled while it loads (its client gone, shutdown) leaves the others their answer.
PostgreSQL: the load is held by a real lock on the tenants table."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gateway.auth.directory import TenantDirectory
from gateway.db.engine import Database

pytestmark = pytest.mark.postgres


async def test_a_caller_cancelled_while_the_tenant_loads_leaves_the_other_callers_their_principal(
    db: Database, database_url: str
):
    directory = TenantDirectory(db, ttl_s=60)
    locker = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        held = locker.transaction()
        await held.start()
        await locker.execute("LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE")
        first = asyncio.ensure_future(directory.principal("acme", "mallory", ["member"]))
        await asyncio.sleep(0.2)
        other = asyncio.ensure_future(directory.principal("acme", "alice", ["member"]))
        await asyncio.sleep(0.2)
        first.cancel()
        await asyncio.sleep(0.1)
        await held.rollback()
        principal = await asyncio.wait_for(other, 30)
        assert first.cancelled()
        assert principal is not None and (principal.tenant_id, principal.user_id) == ("acme", "alice")
    finally:
        await locker.close()
