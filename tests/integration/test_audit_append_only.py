"""The database keeps audit rows insert-only (migration 0013): no row of audit_events can be
changed or deleted, sealed or not; a link (audit_links) cannot be changed, and is deleted
only behind its tenant's anchor (what the prune does with the months it drops). PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from gateway.audit.chain import audit_events, audit_links
from gateway.audit.prune import parse_age, prune
from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import AuditSealer, audit_chains
from gateway.audit.verify import verify_chain
from gateway.db.engine import Database
from gateway.settings import Settings
from tests.conftest import seeded
from tests.support.db import months_ago


@pytest.fixture
async def pg_db(pg_url: str):
    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        yield db
    finally:
        await db.dispose()


def _row(n: int, created_at: datetime | None = None) -> AuditRow:
    return AuditRow(
        tenant_id="acme", kind="tool_call", outcome="OK", created_at=created_at or datetime.now(UTC),
        user_id="alice", run_id="run_1", tool_call_id=f"call_{n}", tool="add", arguments={"a": n},
        arguments_sha256="0" * 64, request_id=f"req_{n}",
    )


async def _append(db: Database, *rows: AuditRow) -> list[int]:
    async with db.begin() as conn:
        await append_audit(conn, *rows)
        ids = (await conn.execute(sa.select(audit_events.c.id).order_by(audit_events.c.id))).scalars()
        return list(ids)[-len(rows):]


async def _refused(db: Database, stmt: Any) -> str:
    with pytest.raises(sa_exc.DBAPIError) as raised:
        async with db.begin() as conn:
            await conn.execute(stmt)
    return str(raised.value.orig)


async def _stored(db: Database, row_id: int) -> Any:
    async with db.connect() as conn:
        return (await conn.execute(sa.select(audit_events).where(audit_events.c.id == row_id))).one()


@pytest.mark.parametrize("sealed", [False, True], ids=["unsealed", "sealed"])
@pytest.mark.parametrize(("column", "value"), [("outcome", "BUDGET_EXCEEDED"), ("arguments", {"a": 99})])
async def test_a_direct_update_of_an_audit_rows_content_is_refused(pg_db, sealed, column, value):
    [row_id] = await _append(pg_db, _row(1))
    if sealed:
        await AuditSealer(pg_db).seal_pending()

    message = await _refused(pg_db, sa.update(audit_events).where(audit_events.c.id == row_id).values({column: value}))

    assert "append-only" in message
    stored = await _stored(pg_db, row_id)
    assert (stored.outcome, stored.arguments) == ("OK", {"a": 1})


async def _link(db: Database, row_id: int) -> Any:
    async with db.connect() as conn:
        return (await conn.execute(sa.select(audit_links).where(audit_links.c.audit_id == row_id))).one()


async def test_a_sealed_rows_link_cannot_be_rewritten(pg_db):
    [row_id] = await _append(pg_db, _row(1))
    await AuditSealer(pg_db).seal_pending()
    sealed = await _link(pg_db, row_id)

    message = await _refused(
        pg_db, sa.update(audit_links).where(audit_links.c.audit_id == row_id).values(chain_hash="f" * 64)
    )

    assert "append-only" in message
    assert (await _link(pg_db, row_id)).chain_hash == sealed.chain_hash


async def test_a_link_ahead_of_the_anchor_cannot_be_deleted(pg_db):
    [row_id] = await _append(pg_db, _row(1))
    await AuditSealer(pg_db).seal_pending()

    message = await _refused(pg_db, sa.delete(audit_links).where(audit_links.c.audit_id == row_id))

    assert "append-only" in message
    assert (await _link(pg_db, row_id)).chain_seq == 1


async def test_sealing_changes_no_audit_row(pg_db):
    [row_id] = await _append(pg_db, _row(1))
    async with pg_db.connect() as conn:
        version = await conn.scalar(sa.text("SELECT xmin::text FROM audit_events WHERE id = :id"), {"id": row_id})
    await AuditSealer(pg_db).seal_pending()
    async with pg_db.connect() as conn:
        after = await conn.scalar(sa.text("SELECT xmin::text FROM audit_events WHERE id = :id"), {"id": row_id})
    assert after == version  # the same row version: never updated
    assert (await _link(pg_db, row_id)).chain_seq == 1


@pytest.mark.parametrize("sealed", [False, True], ids=["unsealed", "sealed"])
async def test_a_direct_delete_of_an_audit_row_is_refused(pg_db, sealed):
    [row_id] = await _append(pg_db, _row(1))
    if sealed:
        await AuditSealer(pg_db).seal_pending()

    message = await _refused(pg_db, sa.delete(audit_events).where(audit_events.c.id == row_id))

    assert "append-only" in message
    assert (await _stored(pg_db, row_id)).id == row_id


async def test_the_sealer_still_links_rows_and_the_chain_verifies(pg_db):
    ids = await _append(pg_db, *(_row(n) for n in range(3)))

    assert await AuditSealer(pg_db).seal_pending() == 3

    async with pg_db.connect() as conn:
        report = await verify_chain(conn, tenant_id="acme")
    assert (report.ok, report.verified_rows) == (True, 3)
    assert [(await _link(pg_db, i)).chain_seq for i in ids] == [1, 2, 3]


async def test_the_prune_drops_the_old_month_behind_the_anchor_it_moves(pg_db):
    old = months_ago(5)
    await _append(pg_db, *(_row(n, old + timedelta(seconds=n)) for n in range(3)))
    kept = await _append(pg_db, _row(3))
    await AuditSealer(pg_db).seal_pending()

    pruned = await prune(pg_db, older_than=parse_age("90d"))

    [result] = pruned.tenants
    assert (result.removed_rows, result.anchor_seq) == (3, 3)
    async with pg_db.connect() as conn:
        chain = (await conn.execute(sa.select(audit_chains).where(audit_chains.c.tenant_id == "acme"))).one()
        left = list((await conn.execute(
            sa.select(audit_events.c.id).where(audit_events.c.kind != "audit_prune")
        )).scalars())
        partition = await conn.scalar(sa.select(sa.func.to_regclass(f"audit_events_p{old:%Y_%m}")))
    assert (chain.anchor_seq, chain.pruned_rows) == (3, 3)
    assert left == kept
    assert partition is None


async def test_a_delete_of_links_reaching_past_the_anchor_is_refused_whole(pg_db):
    old = months_ago(5)
    ids = await _append(pg_db, *(_row(n, old + timedelta(seconds=n)) for n in range(3)))
    await AuditSealer(pg_db).seal_pending()
    await prune(pg_db, older_than=parse_age("90d"))
    newer = await _append(pg_db, _row(9))
    await AuditSealer(pg_db).seal_pending()

    message = await _refused(pg_db, sa.delete(audit_links).where(audit_links.c.audit_id.in_([*ids, *newer])))

    assert "append-only" in message
    assert (await _link(pg_db, newer[0])).chain_seq == 5  # after the 3 pruned rows and the prune's own


async def test_the_audit_rows_of_a_month_cannot_be_deleted_even_when_sealed_and_old(pg_db):
    old = months_ago(5)
    [row_id] = await _append(pg_db, _row(1, old))
    await AuditSealer(pg_db).seal_pending()

    message = await _refused(pg_db, sa.delete(audit_events).where(audit_events.c.created_at < months_ago(4)))

    assert "append-only" in message
    assert (await _stored(pg_db, row_id)).id == row_id
