"""Tenants take turns at the delivery worker: one tenant's backlog, or its receivers that never
answer, cannot hold back another tenant's deliveries. The claim statement on PostgreSQL, and
the worker's loop with real receivers on loopback ports (one that never answers)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from gateway.webhooks import store
from tests.integration.test_webhooks_delivery import db, deliveries, insert_approval, outbox, subscribe, worker_for
from tests.support.webhook_receiver import WebhookReceiver

__all__ = ["db"]

LEASE = timedelta(seconds=60)
NOWHERE = "http://127.0.0.1:9/hook"


async def _acme_backlog_and_one_globex_delivery(database, *, acme_events: int) -> datetime:
    """acme's deliveries due for a minute, globex's one just due; the time to claim at."""
    await subscribe(database, NOWHERE, ["approval.created"])
    await subscribe(database, NOWHERE, ["approval.created"], tenant="globex")
    async with database.begin() as conn:
        for _ in range(acme_events):
            await insert_approval(conn)
        await insert_approval(conn, tenant="globex")
        now = datetime.now(UTC)
        await conn.execute(sa.update(deliveries).where(deliveries.c.tenant_id == "acme")
                           .values(next_attempt_at=now - timedelta(minutes=1)))
    return now + timedelta(seconds=1)


async def _claim(database, *, now: datetime, limit: int) -> list:
    async with database.begin() as conn:
        return await store.claim_due(conn, now=now, lease=LEASE, limit=limit)


async def test_a_claim_serves_another_tenants_due_delivery_before_one_tenants_older_backlog(db):
    now = await _acme_backlog_and_one_globex_delivery(db, acme_events=6)
    claimed = await _claim(db, now=now, limit=3)
    assert sorted(row.tenant_id for row in claimed) == ["acme", "acme", "globex"]


async def test_deliveries_a_tenant_has_in_flight_count_as_its_turns(db):
    """acme's receivers are slow: three of its deliveries are being sent (by this process or
    another). The next free slot goes to globex, not to acme's older fourth delivery."""
    now = await _acme_backlog_and_one_globex_delivery(db, acme_events=6)
    async with db.begin() as conn:
        await conn.execute(sa.update(deliveries).where(deliveries.c.tenant_id == "globex")
                           .values(next_attempt_at=now + timedelta(minutes=1)))
    assert [row.tenant_id for row in await _claim(db, now=now, limit=3)] == ["acme"] * 3
    async with db.begin() as conn:
        await conn.execute(sa.update(deliveries).where(deliveries.c.tenant_id == "globex").values(next_attempt_at=now))
    (claimed,) = await _claim(db, now=now, limit=1)
    assert claimed.tenant_id == "globex"


async def test_concurrent_claims_take_different_rows_and_each_row_once(db):
    now = await _acme_backlog_and_one_globex_delivery(db, acme_events=5)
    async with db.begin() as first:
        held = await store.claim_due(first, now=now, lease=LEASE, limit=2)
        async with db.begin() as second:  # while the first claim is not yet committed
            skipped_past = await store.claim_due(second, now=now, lease=LEASE, limit=2)
    rest = await _claim(db, now=now, limit=10)
    ids = [row.id for row in held + skipped_past + rest]
    assert (len(held), len(skipped_past), len(rest)) == (2, 2, 2)
    assert len(set(ids)) == 6 == len(await outbox(db))
    assert await _claim(db, now=now, limit=10) == []


async def test_a_tenants_receivers_that_never_answer_do_not_hold_back_another_tenants_deliveries(db):
    """acme's 20 deliveries go to a receiver that accepts and never answers; while the worker's
    slots are all waiting on it, globex's 6 deliveries come due. They arrive before acme's
    backlog is worked off (waiting for it, they would arrive after its 20th attempt)."""
    batch, acme_webhooks, acme_events = 4, 5, 4
    acme_backlog = acme_webhooks * acme_events
    acme_attempts_seen: list[int] = []
    async with WebhookReceiver(behaviour=lambda n, _: "hang") as dead, WebhookReceiver(
        behaviour=lambda n, _: acme_attempts_seen.append(len(dead.requests)) or "ok"
    ) as alive:
        for _ in range(acme_webhooks):
            await subscribe(db, dead.url, ["approval.created"])
        for _ in range(3):
            await subscribe(db, alive.url, ["approval.created"], tenant="globex")
        async with db.begin() as conn:
            for _ in range(acme_events):
                await insert_approval(conn)
        worker = worker_for(db, batch_size=batch, timeout_s=1.0, interval_s=0.02, retry_base_s=60, retry_max_s=60)
        worker.start()
        try:
            await dead.wait_for(batch)  # every slot waits on acme's receiver
            async with db.begin() as conn:
                for _ in range(2):
                    await insert_approval(conn, tenant="globex")
            await alive.wait_for(6)
            # Received is not yet recorded: the worker marks a delivery once its answer is read.
            deadline = asyncio.get_running_loop().time() + 10
            while len(await outbox(db, tenant_id="globex", state="delivered")) < 6:
                assert asyncio.get_running_loop().time() < deadline, "received, never recorded as delivered"
                await asyncio.sleep(0.02)
        finally:
            await worker.stop()
    assert len(acme_attempts_seen) == 6
    assert max(acme_attempts_seen) < acme_backlog
    delivered = await outbox(db, tenant_id="globex", state="delivered")
    assert len(delivered) == 6


async def test_one_tenants_backlog_alone_still_fills_every_slot(db):
    """Turns share the slots only between tenants with deliveries due: alone, acme gets them all."""
    now = await _acme_backlog_and_one_globex_delivery(db, acme_events=5)
    async with db.begin() as conn:
        await conn.execute(sa.delete(deliveries).where(deliveries.c.tenant_id == "globex"))
    assert [row.tenant_id for row in await _claim(db, now=now, limit=4)] == ["acme"] * 4


async def test_a_claim_reads_as_far_as_it_claims_not_a_tenants_whole_backlog(db):
    """The claim merges the tenants' due deliveries through their index and stops at its limit:
    with 2,000 of acme's deliveries due, claiming 3 reads a few rows, not the backlog."""
    now = await _acme_backlog_and_one_globex_delivery(db, acme_events=1)
    async with db.begin() as conn:
        await conn.execute(sa.text(
            "INSERT INTO webhook_deliveries (id, tenant_id, subscription_id, event_type, data, created_at, "
            "next_attempt_at, window_started_at) "
            "SELECT 'msg_' || n, d.tenant_id, d.subscription_id, d.event_type, d.data, d.created_at, "
            "d.next_attempt_at + n * interval '1 microsecond', d.window_started_at "
            "FROM webhook_deliveries d, generate_series(1, 2000) n WHERE d.tenant_id = 'acme'"
        ))
        await conn.execute(sa.text("ANALYZE webhook_deliveries"))
    async with db.begin() as conn:
        (plan,) = (await conn.execute(
            sa.text("EXPLAIN (ANALYZE, FORMAT JSON) " + store._CLAIM.text),
            {"now": now, "lease_until": now + LEASE, "limit": 3},
        )).scalar_one()
        await conn.rollback()

    def rows_read(node: dict) -> int:
        own = 0
        if node.get("Relation Name") == "webhook_deliveries":
            own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        return own + sum(rows_read(child) for child in node.get("Plans", []))

    assert rows_read(plan["Plan"]) < 50
