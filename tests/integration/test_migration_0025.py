"""Migration 0025 (only the operator waives approval): a `never` the operator wrote last
keeps its waiver, one a tenant administrator wrote does not. PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from gateway.db.migrate import alembic_config
from tests.conftest import seeded
from tests.support import db

pytestmark = pytest.mark.postgres


async def test_the_upgrade_keeps_the_operators_never_as_a_waiver_and_no_other(pg_url):
    await seeded(pg_url)
    config = alembic_config(pg_url)
    await asyncio.to_thread(command.downgrade, config, "0024")
    insert = sa.text(
        "INSERT INTO tool_policies (tenant_id, tool, enabled, approval_mode, updated_by, updated_at) "
        "VALUES ('acme', :tool, true, :mode, :by, :at)"
    )
    now = datetime.now(UTC)
    async with db.open_database(pg_url) as database, database.begin() as conn:
        for tool, mode, by in (("create_article", "never", "operator:cli"), ("notes_delete", "never", "carol"),
                               ("add", "always", "operator:cli")):
            await conn.execute(insert, {"tool": tool, "mode": mode, "by": by, "at": now})
    await asyncio.to_thread(command.upgrade, config, "head")
    waived = await db.rows(pg_url, sa.text("SELECT tool, approval_waived FROM tool_policies ORDER BY tool"))
    assert [tuple(row) for row in waived] == [("add", False), ("create_article", True), ("notes_delete", False)]
