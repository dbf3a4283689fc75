"""Migration 0022 (a link's chain hash covers its row's time): links sealed before it read as
version 1 and still verify; its downgrade refuses while version-2 links exist (the release
before would report them broken) and, once none are left, goes down and up again with the
chains intact. PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import AuditSealer
from gateway.audit.verify import verify_chain
from gateway.db.migrate import alembic_config
from tests.conftest import seeded
from tests.support import db

pytestmark = pytest.mark.postgres

_HAS_VERSION = sa.text(
    "SELECT count(*) FROM information_schema.columns WHERE table_name = 'audit_links' AND column_name = 'hash_version'"
)


async def _seal_rows(url: str, count: int) -> None:
    async with db.open_database(url) as database:
        async with database.begin() as conn:
            for n in range(count):
                await append_audit(conn, AuditRow(tenant_id="acme", kind="tool_call", outcome="OK", tool=f"t{n}", created_at=datetime.now(UTC)))
        await AuditSealer(database).seal_pending()


async def _verified(url: str) -> tuple[bool, int]:
    async with db.open_database(url) as database, database.connect() as conn:
        report = await verify_chain(conn, tenant_id="acme")
    return report.ok, report.verified_rows


async def test_downgrade_refuses_version_2_links_and_goes_down_and_up_once_there_are_none(pg_url):
    await seeded(pg_url)
    await _seal_rows(pg_url, 3)
    config = alembic_config(pg_url)
    # The later migrations go down first, each in its own transaction: from 0022 on, this one's.
    await asyncio.to_thread(command.downgrade, config, "0022")
    with pytest.raises(Exception, match="hash version 2 exist"):
        await asyncio.to_thread(command.downgrade, config, "0021")
    # Nothing of this downgrade stayed: the column and the chain are as they were.
    assert await db.rows(pg_url, _HAS_VERSION) == [(1,)]
    await asyncio.to_thread(command.upgrade, config, "head")
    assert await _verified(pg_url) == (True, 3)

    await asyncio.to_thread(command.downgrade, config, "0022")
    async with db.open_database(pg_url) as database:
        await db.relink_as_version_1(database)  # as the release before sealed them
    await asyncio.to_thread(command.downgrade, config, "0021")
    assert await db.rows(pg_url, _HAS_VERSION) == [(0,)]
    await asyncio.to_thread(command.upgrade, config, "head")
    versions = await db.rows(pg_url, sa.text("SELECT hash_version FROM audit_links ORDER BY chain_seq"))
    assert [v for (v,) in versions] == [1, 1, 1]
    assert await _verified(pg_url) == (True, 3)
    await _seal_rows(pg_url, 2)
    assert await _verified(pg_url) == (True, 5)
