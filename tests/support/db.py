"""Reading and moving the test database directly (what an operator or the clock would do)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.db.models import Approval, Article, AuditEvent, Run, ToolCall
from gateway.settings import Settings


@asynccontextmanager
async def open_database(url: str) -> AsyncIterator[Database]:
    db = Database.from_settings(Settings.from_flat(database_url=url))
    try:
        yield db
    finally:
        await db.dispose()


async def rows(url: str, stmt: Any) -> list[Any]:
    async with open_database(url) as db, db.connect() as conn:
        return list((await conn.execute(stmt)).all())


async def execute(url: str, stmt: Any) -> None:
    async with open_database(url) as db, db.begin() as conn:
        await conn.execute(stmt)


def _select(table: sa.Table, **where: Any) -> sa.Select[Any]:
    """The rows of ``table`` whose columns equal the given values."""
    return sa.select(table).where(*(table.c[column] == value for column, value in where.items()))


async def audit_rows(url: str, **where: Any) -> list[Any]:
    table = AuditEvent.__table__
    return await rows(url, _select(table, **where).order_by(table.c.id))


async def approvals(url: str, **where: Any) -> list[Any]:
    return await rows(url, _select(Approval.__table__, **where))


async def articles(url: str, **where: Any) -> list[Any]:
    return await rows(url, _select(Article.__table__, **where))


async def tool_call_rows(url: str, run_id: str) -> list[Any]:
    return await rows(url, _select(ToolCall.__table__, run_id=run_id))


def past(seconds: float = 60) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


async def expire_run(url: str, run_id: str) -> None:
    """Move the run's expiry into the past instead of waiting for it."""
    table = Run.__table__
    await execute(url, sa.update(table).where(table.c.id == run_id).values(expires_at=past()))


async def expire_approval(url: str, approval_id: str) -> None:
    table = Approval.__table__
    await execute(url, sa.update(table).where(table.c.id == approval_id).values(expires_at=past()))


async def set_approval_mode(url: str, tool: str, mode: str, tenant: str = "acme", *, registry: Any = None) -> str:
    """What the operator does with `gateway tenants approval-mode TENANT TOOL MODE`."""
    from gateway.admin import operator
    from gateway.db.policies import ApprovalMode
    from gateway.tools.builtin import builtin_tools
    from gateway.tools.registry import ToolRegistry

    async with open_database(url) as db:
        return await operator.set_approval_mode(
            db, tenant, tool, ApprovalMode(mode), registry=registry or ToolRegistry(builtin_tools())
        )


def months_ago(months: int, *, day: int = 2, now: datetime | None = None) -> datetime:
    """Noon UTC on ``day`` of the calendar month ``months`` before the current one: a time
    whose month is whole and past, whatever today's date (retention drops whole months)."""
    now = now or datetime.now(UTC)
    index = now.year * 12 + now.month - 1 - months
    return datetime(index // 12, index % 12 + 1, day, 12, tzinfo=UTC)


def month_start(months: int, *, now: datetime | None = None) -> datetime:
    """Midnight UTC on the first day of the calendar month ``months`` before the current one."""
    now = now or datetime.now(UTC)
    index = now.year * 12 + now.month - 1 - months
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def across_a_month_boundary(*, now: datetime | None = None) -> tuple[datetime, datetime, timedelta]:
    """Times on either side of the start of last month, as rows sealed out of order there have
    them (a transaction open across midnight), and the age a prune needs to drop the month
    before last and keep last month: (dropped row's time, kept row's time, age)."""
    now = now or datetime.now(UTC)
    boundary = month_start(1, now=now)
    return boundary - timedelta(minutes=10), boundary + timedelta(minutes=30), now - (boundary + timedelta(days=1))


async def relink_as_version_1(db: Database) -> None:
    """Rewrite every tenant's chain as a release before migration 0022 sealed it (link-hash
    version 1, from the genesis hash: chains never pruned), head included."""
    from gateway.audit.chain import audit_links, genesis_hash, link_hash
    from gateway.audit.sealer import audit_chains

    async with db.begin() as conn:
        await conn.execute(sa.text("ALTER TABLE audit_links DISABLE TRIGGER USER"))
        links = (await conn.execute(
            sa.select(audit_links).order_by(audit_links.c.tenant_id, audit_links.c.chain_seq)
        )).all()
        heads: dict[str, str] = {}
        for link in links:
            prev = heads.get(link.tenant_id, genesis_hash(link.tenant_id))
            chained = link_hash(link.chain_seq, prev, link.content_hash, link.created_at, version=1)
            await conn.execute(
                sa.update(audit_links)
                .where(audit_links.c.tenant_id == link.tenant_id, audit_links.c.chain_seq == link.chain_seq)
                .values(prev_hash=prev, chain_hash=chained, hash_version=1)
            )
            heads[link.tenant_id] = chained
        for tenant_id, head in heads.items():
            await conn.execute(
                sa.update(audit_chains).where(audit_chains.c.tenant_id == tenant_id).values(head_hash=head)
            )
        await conn.execute(sa.text("ALTER TABLE audit_links ENABLE TRIGGER USER"))
