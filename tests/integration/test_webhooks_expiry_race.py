"""The worker's expiry sweep against an approver deciding the same approval at the same moment:
whichever takes the row first wins, the other sees it decided; an approval is never both
approved and expired. PostgreSQL, two connections, the lock held on purpose."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from gateway.db import approvals as q
from gateway.execution.approvals import _EXPIRY_CONTENTS
from gateway.webhooks import store
from tests.integration.test_webhooks_delivery import approvals, db, insert_approval, outbox, subscribe, tool_calls

__all__ = ["db"]


async def _status(database, approval_id: str) -> tuple[str, str | None]:
    async with database.connect() as conn:
        row = (await conn.execute(sa.select(approvals.c.status, tool_calls.c.outcome)
                                  .join(tool_calls, tool_calls.c.approval_id == approvals.c.id)
                                  .where(approvals.c.id == approval_id))).one()
    return row.status, row.outcome


async def test_a_sweep_while_an_approval_is_being_claimed_leaves_it_to_the_approver(db):
    await subscribe(db, "http://127.0.0.1:9/hook", ["approval.expired"])
    async with db.begin() as conn:
        approval_id = await insert_approval(conn, expires_in_s=5)
    now = datetime.now(UTC)
    async with db.begin() as approver:
        assert await q.claim_for_execution(approver, tenant_id="acme", approval_id=approval_id, approver_id="carol",
                                           now=now)
        async with db.begin() as sweeper:  # later, past the expiry, while the claim is not yet committed
            expired = await store.expire_due_approvals(sweeper, now=now + timedelta(seconds=10),
                                                       contents=_EXPIRY_CONTENTS, limit=10)
        assert expired == 0
    assert (await _status(db, approval_id))[0] == "executing"
    assert not await outbox(db, event_type="approval.expired")


async def test_an_approver_claiming_while_the_sweep_expires_it_is_refused(db):
    await subscribe(db, "http://127.0.0.1:9/hook", ["approval.expired"])
    async with db.begin() as conn:
        approval_id = await insert_approval(conn, expires_in_s=5)
    now = datetime.now(UTC)
    async with db.begin() as sweeper:
        assert await store.expire_due_approvals(sweeper, now=now + timedelta(seconds=10), contents=_EXPIRY_CONTENTS,
                                                limit=10) == 1

        async def claim() -> bool:
            async with db.begin() as approver:
                return await q.claim_for_execution(approver, tenant_id="acme", approval_id=approval_id,
                                                   approver_id="carol", now=now)

        claiming = asyncio.create_task(claim())
        await asyncio.sleep(0.3)
        assert not claiming.done()  # waits on the sweep's row lock
    assert await asyncio.wait_for(claiming, 10) is False
    assert await _status(db, approval_id) == ("expired", "APPROVAL_EXPIRED")
    assert len(await outbox(db, event_type="approval.expired")) == 1


async def test_the_sweep_reads_only_the_approvals_of_tenants_with_an_expiry_webhook(db):
    """A review's finding: the sweep scanned every tenant's pending approvals each round of
    each process, so one tenant's backlog cost every process a table scan a second."""
    await subscribe(db, "http://127.0.0.1:9/hook", ["approval.expired"], tenant="globex")
    async with db.begin() as conn:
        for _ in range(3):
            await insert_approval(conn, tenant="globex", expires_in_s=5)
        backlog = await insert_approval(conn, tenant="acme")  # acme: no such webhook, a thousand pending
        await conn.execute(sa.text(
            "INSERT INTO approvals (id, tenant_id, run_id, tool_call_id, requester_id, requester_roles, tool, "
            "canonical_arguments, arguments_sha256, status, created_at, expires_at) "
            "SELECT 'apr_b' || i, tenant_id, run_id, 'b' || i, requester_id, requester_roles, tool, "
            "canonical_arguments, arguments_sha256, status, created_at, created_at - interval '1 hour' "
            "FROM approvals, generate_series(1, 1000) AS i WHERE id = :id"
        ).bindparams(id=backlog))
    async with db.begin() as conn:
        await conn.execute(sa.text("ANALYZE approvals"))  # as autovacuum would have: the plan the planner picks then
    rows_read = sa.text(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
        "WHERE relname = 'approvals'"
    )
    async with db.begin() as sweeper:
        before = await sweeper.scalar(rows_read)  # the session's counts not yet reported count too
        expired = await store.expire_due_approvals(sweeper, now=datetime.now(UTC) + timedelta(seconds=10),
                                                   contents=_EXPIRY_CONTENTS, limit=100)
        read = await sweeper.scalar(rows_read) - before
    assert expired == 3
    assert read < 50, read  # globex's few, not acme's thousand
