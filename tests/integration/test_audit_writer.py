"""One writer of audit rows (``gateway.audit.rows``): what Python writes and what the hot
path's SQL writes are stored alike. PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from gateway.audit.chain import audit_events
from gateway.audit.rows import AuditRow, append_audit, append_audit_where
from gateway.db.engine import Database
from gateway.db.models import Run
from gateway.settings import Settings
from tests.conftest import seeded

AT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
async def pg_db(pg_url: str):
    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        yield db
    finally:
        await db.dispose()


async def _null_columns(db: Database, kind: str) -> set[str]:
    async with db.connect() as conn:
        row = (await conn.execute(sa.select(
            (audit_events.c.arguments.is_(None)).label("arguments"), (audit_events.c.detail.is_(None)).label("detail")
        ).where(audit_events.c.kind == kind))).one()
    return {name for name, is_null in row._mapping.items() if is_null}


async def test_a_row_without_arguments_or_detail_stores_sql_null_from_python_and_from_sql(pg_db):
    async with pg_db.begin() as conn:
        await append_audit(conn, AuditRow(tenant_id="acme", kind="from_python", outcome="OK", created_at=AT))
        await conn.execute(
            sa.text("SELECT gateway_append_audit(CAST(:rows AS jsonb))"),
            {"rows": '[{"tenant_id": "acme", "kind": "from_sql", "outcome": "OK", "created_at": "2030-01-02T03:04:05Z"}]'},
        )

    assert await _null_columns(pg_db, "from_python") == {"arguments", "detail"}
    assert await _null_columns(pg_db, "from_sql") == {"arguments", "detail"}


async def test_a_conditional_row_is_written_only_when_its_condition_holds(pg_db):
    runs = Run.__table__
    row = AuditRow(tenant_id="acme", kind="protocol_rejection", outcome="X", created_at=AT, run_id="run_missing",
                   detail={"message": "m"})
    async with pg_db.begin() as conn:
        missing = await append_audit_where(conn, row, sa.exists().where(runs.c.id == "run_missing"))
        present = await append_audit_where(conn, row, sa.true())
        stored = (await conn.execute(sa.select(audit_events).where(audit_events.c.kind == "protocol_rejection"))).all()

    assert (missing, present) == (False, True)
    assert [(r.run_id, r.detail, r.created_at) for r in stored] == [("run_missing", {"message": "m"}, AT)]
