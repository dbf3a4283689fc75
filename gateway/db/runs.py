"""Tenant- and owner-scoped queries for runs."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import Run

runs = Run.__table__


def the_run(run_id: str, *, tenant_id: str, user_id: str) -> sa.ColumnElement[bool]:
    """The run ``run_id`` when it is this user's of this tenant.

    Found through the primary key ``(tenant_id, id)``; the user is compared with IS NOT DISTINCT
    FROM, which no index serves. With a plain equality a plan made while the table was small
    could look the run up in ``(tenant_id, user_id, created_at)``, reading every older run of the
    owner first (migration 0017). The columns are NOT NULL, so a NULL argument matches nothing,
    as with ``=``."""
    return sa.and_(
        runs.c.tenant_id == tenant_id,
        runs.c.id == run_id,
        runs.c.user_id.is_not_distinct_from(user_id),
    )


def the_tenants_run(run_id: str, *, tenant_id: str) -> sa.ColumnElement[bool]:
    """The run ``run_id`` when it is this tenant's, whoever started it; by its primary key."""
    return sa.and_(runs.c.tenant_id == tenant_id, runs.c.id == run_id)


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex


async def create_run(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    user_id: str,
    max_tool_calls: int,
    max_repeats: int,
    expires_at: datetime | None,
    now: datetime,
    columns: Mapping[str, Any] | None = None,
) -> Any:
    """``columns``: further values of the new row (an agent run's loop state and limits)."""
    run_id = new_run_id()
    await conn.execute(
        sa.insert(runs).values(
            id=run_id,
            tenant_id=tenant_id,
            user_id=user_id,
            max_tool_calls=max_tool_calls,
            max_repeats=max_repeats,
            used_tool_calls=0,
            expires_at=expires_at,
            created_at=now,
            **(columns or {}),
        )
    )
    return await get_run(conn, tenant_id=tenant_id, user_id=user_id, run_id=run_id)


async def get_run(conn: AsyncConnection, *, tenant_id: str, user_id: str, run_id: str) -> Any | None:
    """A run of another user or tenant is simply not found."""
    return (
        await conn.execute(
            sa.select(runs).where(the_run(run_id, tenant_id=tenant_id, user_id=user_id))
        )
    ).first()
