"""audit_events is partitioned by month (migration 0013): reads by tenant and time touch only
the months they ask for, and an insert never fails for want of a partition. PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from gateway.audit.chain import audit_events
from gateway.audit.queries import AuditFilters, select_rows
from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import AuditSealer
from gateway.audit.verify import verify_chain
from gateway.db.engine import Database
from tests.support.db import months_ago


def _row(n: int, created_at) -> AuditRow:  # type: ignore[no-untyped-def]
    return AuditRow(tenant_id="acme", kind="tool_call", outcome="OK", created_at=created_at, tool="add",
                    run_id="run_1", request_id=f"req_{n}")


def _scanned(plan: object) -> set[str]:
    """The relations a JSON plan reads."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "Relation Name" in node:
                found.add(node["Relation Name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


async def _plan(db: Database, stmt: sa.Select) -> set[str]:  # type: ignore[type-arg]
    sql = str(stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
    async with db.connect() as conn:
        plan = await conn.scalar(sa.text(f"EXPLAIN (FORMAT JSON) {sql}"))
    return _scanned(json.loads(plan) if isinstance(plan, str) else plan)


async def test_a_query_by_tenant_and_time_reads_only_the_months_it_spans(db):
    async with db.begin() as conn:
        await append_audit(conn, *(_row(n, months_ago(m)) for n, m in enumerate((0, 1, 2, 3))))
    await AuditSealer(db).seal_pending()  # its round makes the months of the rows in the default
    one_month = AuditFilters(since=months_ago(2, day=1), until=months_ago(2, day=20))

    scanned = await _plan(db, select_rows("acme", one_month).limit(50))

    assert {name for name in scanned if name.startswith("audit_events")} == {f"audit_events_p{months_ago(2):%Y_%m}"}
    async with db.connect() as conn:
        rows = (await conn.execute(select_rows("acme", one_month).limit(50))).all()
    assert [(r.created_at, r.chain_seq is not None) for r in rows] == [(months_ago(2), True)]

    two_months = AuditFilters(since=months_ago(2, day=1), until=months_ago(0, day=1) - timedelta(hours=12))
    scanned = await _plan(db, select_rows("acme", two_months).limit(50))
    assert {name for name in scanned if name.startswith("audit_events")} == {
        f"audit_events_p{months_ago(2):%Y_%m}", f"audit_events_p{months_ago(1):%Y_%m}"
    }


async def test_an_insert_for_a_month_without_a_partition_lands_in_the_default_and_moves_out_later(db):
    far = months_ago(-30)  # 30 months ahead: no partition is made that far
    async with db.begin() as conn:
        await append_audit(conn, _row(1, far), _row(2, far + timedelta(days=1)))
    async with db.connect() as conn:
        placed = set((await conn.execute(sa.select(sa.text("tableoid::regclass::text")).select_from(audit_events))).scalars())
    assert placed == {"audit_events_default"}

    await AuditSealer(db).seal_pending()

    async with db.connect() as conn:
        placed = set((await conn.execute(sa.select(sa.text("tableoid::regclass::text")).select_from(audit_events))).scalars())
        default_rows = await conn.scalar(sa.text("SELECT count(*) FROM audit_events_default"))
        report = await verify_chain(conn, tenant_id="acme")
    assert placed == {f"audit_events_p{far:%Y_%m}"} and default_rows == 0
    assert (report.ok, report.verified_rows) == (True, 2)
