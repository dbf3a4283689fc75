"""The database keeps audit rows append-only (migration 0008): a row's content cannot be
changed nor a row deleted, except the sealer linking unsealed rows into their chain and the
prune removing a sealed prefix behind the moved anchor. PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from gateway.audit.chain import audit_events
from gateway.audit.prune import parse_age, prune
from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import AuditSealer, audit_chains
from gateway.audit.verify import verify_chain
from gateway.db.engine import Database
from gateway.settings import Settings
from tests.conftest import seeded


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


async def test_a_sealed_rows_chain_columns_cannot_be_rewritten(pg_db):
    [row_id] = await _append(pg_db, _row(1))
    await AuditSealer(pg_db).seal_pending()
    sealed = await _stored(pg_db, row_id)

    message = await _refused(
        pg_db, sa.update(audit_events).where(audit_events.c.id == row_id).values(chain_seq=None, chain_hash="f" * 64)
    )

    assert "append-only" in message
    stored = await _stored(pg_db, row_id)
    assert (stored.chain_seq, stored.chain_hash) == (sealed.chain_seq, sealed.chain_hash)


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
    assert [(await _stored(pg_db, i)).chain_seq for i in ids] == [1, 2, 3]


async def test_the_prune_still_removes_the_old_prefix_behind_the_anchor_it_moves(pg_db):
    old = datetime.now(UTC) - timedelta(days=120)
    await _append(pg_db, *(_row(n, old + timedelta(seconds=n)) for n in range(3)))
    kept = await _append(pg_db, _row(3))
    await AuditSealer(pg_db).seal_pending()

    [result] = await prune(pg_db, older_than=parse_age("90d"), tenant_id="acme")

    assert (result.removed_rows, result.anchor_seq) == (3, 3)
    async with pg_db.connect() as conn:
        chain = (await conn.execute(sa.select(audit_chains).where(audit_chains.c.tenant_id == "acme"))).one()
        left = list((await conn.execute(
            sa.select(audit_events.c.id).where(audit_events.c.kind != "audit_prune")
        )).scalars())
    assert (chain.anchor_seq, chain.pruned_rows) == (3, 3)
    assert left == kept


async def test_a_delete_reaching_past_the_anchor_is_refused_whole(pg_db):
    old = datetime.now(UTC) - timedelta(days=120)
    ids = await _append(pg_db, *(_row(n, old + timedelta(seconds=n)) for n in range(3)))
    await AuditSealer(pg_db).seal_pending()
    await prune(pg_db, older_than=parse_age("90d"), tenant_id="acme")
    newer = await _append(pg_db, _row(9))
    await AuditSealer(pg_db).seal_pending()

    message = await _refused(pg_db, sa.delete(audit_events).where(audit_events.c.id.in_([*ids, *newer])))

    assert "append-only" in message
    assert (await _stored(pg_db, newer[0])).id == newer[0]
