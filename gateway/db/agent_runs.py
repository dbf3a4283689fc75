"""Tenant-scoped queries for agent runs: loop state and usage on ``runs``, history in ``run_messages``.

A history message is stored with any text PostgreSQL cannot hold replaced (``storable``):
a model's answer is kept whatever it holds, and one message can never fail the write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import Run, RunMessage
from gateway.db.runs import the_run, the_tenants_run
from gateway.text import storable

runs = Run.__table__
run_messages = RunMessage.__table__


async def append_messages(
    conn: AsyncConnection, *, tenant_id: str, run_id: str, first_seq: int, messages: list[dict[str, Any]],
    now: datetime,
) -> None:
    if not messages:
        return
    await conn.execute(
        sa.insert(run_messages),
        [
            {"run_id": run_id, "seq": first_seq + i, "tenant_id": tenant_id, "message": storable(message),
             "created_at": now}
            for i, message in enumerate(messages)
        ],
    )


async def replace_message(
    conn: AsyncConnection, *, tenant_id: str, run_id: str, seq: int, message: dict[str, Any]
) -> None:
    await conn.execute(
        sa.update(run_messages)
        .where(run_messages.c.tenant_id == tenant_id, run_messages.c.run_id == run_id, run_messages.c.seq == seq)
        .values(message=storable(message))
    )


async def load_messages(conn: AsyncConnection, *, tenant_id: str, run_id: str) -> list[dict[str, Any]]:
    rows = await conn.execute(
        sa.select(run_messages.c.message)
        .where(run_messages.c.tenant_id == tenant_id, run_messages.c.run_id == run_id)
        .order_by(run_messages.c.seq)
    )
    return [row[0] for row in rows]


async def update_loop(conn: AsyncConnection, *, tenant_id: str, run_id: str, **values: Any) -> None:
    await conn.execute(
        sa.update(runs).where(the_tenants_run(run_id, tenant_id=tenant_id)).values(**values)
    )


async def claim_state(
    conn: AsyncConnection, *, tenant_id: str, user_id: str, run_id: str, expected: str, new: str, now: datetime
) -> bool:
    """Move the loop from ``expected`` to ``new`` in one statement; False when it was not in ``expected``."""
    result = await conn.execute(
        sa.update(runs)
        .where(the_run(run_id, tenant_id=tenant_id, user_id=user_id), runs.c.loop_state == expected)
        .values(loop_state=new, updated_at=now)
    )
    return result.rowcount == 1
