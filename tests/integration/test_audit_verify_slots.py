"""The console's chain verification holds a database connection for its one snapshot and
hashes every row: a tenant runs one at a time, a process two, so that one tenant's
verifications cannot take the pool from the others. On a real gateway process (concurrent
requests), PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from tests.conftest import seeded
from tests.support.console import sign_in
from tests.support.processes import gateways

pytestmark = pytest.mark.postgres


async def _signed_in(base: str, tenant: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=60, follow_redirects=False)
    await sign_in(client, "carol", tenant)
    return client


async def test_verifications_over_the_tenants_or_the_processs_cap_are_429_pages(pg_url):
    await seeded(pg_url)
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    with gateways(pg_url, 1, audit_seal_interval_s=0, database_statement_timeout_s=60,
                  audit_verify_max_per_process=2) as (gateway,):
        acme, acme_too, globex, globex_too = [
            await _signed_in(gateway.url, tenant) for tenant in ("acme", "acme", "globex", "globex")
        ]
        locker, watcher = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        try:
            locking = locker.transaction()
            await locking.start()
            await locker.execute("LOCK TABLE audit_links IN ACCESS EXCLUSIVE MODE")
            held = [asyncio.create_task(client.get("/console/audit/verify")) for client in (acme, globex)]
            for _ in range(500):  # until both wait on the lock, holding their slots
                waiting = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                if waiting == 2:
                    break
                await asyncio.sleep(0.02)
            assert waiting == 2
            # acme has its one; and the process its two, whoever asks.
            for client in (acme_too, globex_too):
                refused = await client.get("/console/audit/verify")
                assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
                assert "Too many chain verifications" in refused.text
            # The console is served meanwhile (a page that reads no link).
            approvals = await globex_too.get("/console/approvals")
            assert approvals.status_code == 200
            await locking.rollback()
            assert [(await task).status_code for task in held] == [200, 200]
        finally:
            await locker.close()
            await watcher.close()
        again = await acme_too.get("/console/audit/verify")
        assert again.status_code == 200 and "tenant acme: OK" in again.text
        for client in (acme, acme_too, globex, globex_too):
            await client.aclose()
