"""Tenant-scoped queries for approvals and the tool calls they hold back.

An approval moves ``pending → executing → succeeded | failed``, or ``pending → rejected``,
or ``pending → expired``; every move is one conditional UPDATE, so two approvers, two
processes or a retry cannot both win it. An approval can be decided only while it and its
run are both unexpired: the same UPDATE checks the run, so a run that expires cannot have
a call executed after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import Approval, Run, ToolCall

approvals = Approval.__table__
runs = Run.__table__
tool_calls = ToolCall.__table__

FINAL_STATUSES = ("succeeded", "failed", "rejected", "expired")


def the_approval(approval_id: str, *, tenant_id: str) -> sa.ColumnElement[bool]:
    """The approval ``approval_id`` when it is the tenant's, by its primary key ``(tenant_id, id)``.

    Two more indexes lead with ``tenant_id``. While the table has no statistics (a new install,
    before autoanalyze), the planner costs them alike for a lookup by id and may keep a plan that
    reads the tenant's approvals through one of them; once it has statistics it takes the
    primary key (``tests/integration/test_tenant_keys.py``). Approvals move at a person's pace,
    and autoanalyze comes after the first fifty."""
    return sa.and_(approvals.c.tenant_id == tenant_id, approvals.c.id == approval_id)


def _the_approvals_run() -> tuple[sa.ColumnElement[bool], ...]:
    return runs.c.tenant_id == approvals.c.tenant_id, runs.c.id == approvals.c.run_id


_run_expires_at = (
    sa.select(runs.c.expires_at).where(*_the_approvals_run()).scalar_subquery().label("run_expires_at")
)
"""Read with each approval: a pending approval of an expired run reads as expired."""


def _run_expired(now: datetime) -> sa.ColumnElement[bool]:
    """The approval's run has passed its ``expires_at`` (the rule the ledger applies to new calls)."""
    return sa.exists().where(*_the_approvals_run(), runs.c.expires_at <= now)


async def get_approval(conn: AsyncConnection, *, tenant_id: str, approval_id: str) -> Any | None:
    return (
        await conn.execute(
            sa.select(approvals, _run_expires_at).where(the_approval(approval_id, tenant_id=tenant_id))
        )
    ).first()


async def list_approvals(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    status: str | None,
    now: datetime,
    limit: int,
    after: tuple[datetime, str] | None,
) -> list[Any]:
    """Newest first, keyset-paginated on (created_at, id)."""
    stmt = sa.select(approvals, _run_expires_at).where(approvals.c.tenant_id == tenant_id)
    if status == "pending":
        stmt = stmt.where(*_undecided(now))
    elif status == "expired":
        stmt = stmt.where(
            sa.or_(
                approvals.c.status == "expired",
                sa.and_(approvals.c.status == "pending", sa.not_(sa.and_(*_undecided(now)))),
            )
        )
    elif status is not None:
        stmt = stmt.where(approvals.c.status == status)
    if after is not None:
        created_at, approval_id = after
        stmt = stmt.where(
            sa.or_(
                approvals.c.created_at < created_at,
                sa.and_(approvals.c.created_at == created_at, approvals.c.id < approval_id),
            )
        )
    stmt = stmt.order_by(approvals.c.created_at.desc(), approvals.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).all())


async def _move(
    conn: AsyncConnection, *, tenant_id: str, approval_id: str, when: Iterable[sa.ColumnElement[bool]], **values: Any
) -> bool:
    """One move of an approval: a conditional UPDATE of the tenant's row; True if this caller made it."""
    result = await conn.execute(
        sa.update(approvals)
        .where(the_approval(approval_id, tenant_id=tenant_id), *when)
        .values(**values)
    )
    return result.rowcount == 1


def _undecided(now: datetime) -> tuple[sa.ColumnElement[bool], ...]:
    """Pending, not expired, and its run not expired: an approver may still decide it."""
    return approvals.c.status == "pending", approvals.c.expires_at > now, ~_run_expired(now)


async def claim_for_execution(
    conn: AsyncConnection, *, tenant_id: str, approval_id: str, approver_id: str, now: datetime
) -> bool:
    return await _move(
        conn, tenant_id=tenant_id, approval_id=approval_id, when=_undecided(now),
        status="executing", decided_by=approver_id, decided_at=now,
    )


async def reject(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    approval_id: str,
    approver_id: str,
    reason: str,
    outcome: str,
    content: str,
    now: datetime,
) -> bool:
    return await _move(
        conn, tenant_id=tenant_id, approval_id=approval_id, when=_undecided(now),
        status="rejected", decided_by=approver_id, decided_at=now, reason=reason,
        outcome=outcome, outcome_content=content, finished_at=now,
    )


async def expire_if_due(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    approval_id: str,
    now: datetime,
    contents: dict[str, str],
) -> str | None:
    """Expire a pending approval whose run expired (outcome ``RUN_EXPIRED``) or that expired
    itself (``APPROVAL_EXPIRED``); ``contents`` maps each outcome to its content. Returns the
    outcome if this caller expired it."""
    run_expired = _run_expired(now)
    outcome = sa.case((run_expired, "RUN_EXPIRED"), else_="APPROVAL_EXPIRED")
    content = sa.case((run_expired, contents["RUN_EXPIRED"]), else_=contents["APPROVAL_EXPIRED"])
    result = await conn.execute(
        sa.update(approvals)
        .where(
            the_approval(approval_id, tenant_id=tenant_id),
            approvals.c.status == "pending",
            sa.or_(approvals.c.expires_at <= now, run_expired),
        )
        .values(status="expired", outcome=outcome, outcome_content=content, finished_at=now)
        .returning(approvals.c.outcome)
    )
    return result.scalar()


async def finish(
    conn: AsyncConnection, *, tenant_id: str, approval_id: str, succeeded: bool, outcome: str, content: str, now: datetime
) -> None:
    await _move(
        conn, tenant_id=tenant_id, approval_id=approval_id, when=(approvals.c.status == "executing",),
        status="succeeded" if succeeded else "failed", outcome=outcome, outcome_content=content, finished_at=now,
    )


async def call_is_finished(conn: AsyncConnection, *, tenant_id: str, run_id: str, tool_call_id: str) -> bool:
    """Whether the call has its outcome stored (its row locked until the transaction ends)."""
    status = (await conn.execute(
        sa.select(tool_calls.c.status)
        .where(
            tool_calls.c.tenant_id == tenant_id,
            tool_calls.c.run_id == run_id,
            tool_calls.c.tool_call_id == tool_call_id,
        )
        .with_for_update()
    )).scalar_one_or_none()
    return status == "done"


async def store_call_outcome(
    conn: AsyncConnection, *, tenant_id: str, run_id: str, tool_call_id: str, outcome: str, content: str,
    now: datetime,
) -> None:
    """The held-back tool call now answers replays with this outcome."""
    await conn.execute(
        sa.update(tool_calls)
        .where(
            tool_calls.c.tenant_id == tenant_id,
            tool_calls.c.run_id == run_id,
            tool_calls.c.tool_call_id == tool_call_id,
        )
        .values(status="done", outcome=outcome, content=content, finished_at=now)
    )

