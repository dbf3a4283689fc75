"""Tenant-scoped reads of the audit: filters and keyset pages (newest first).

A row's chain columns come from its link (``audit_links``; ``null`` until it is sealed). A
filter on time (``since``, ``until``) is on ``created_at``, the partition key: the query
reads only the partitions of the months it spans."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.chain import CHAIN_FIELDS, audit_events, audit_links
from gateway.tools.base import REDACTED

EXPORT_COLUMNS: tuple[str, ...] = (
    "id", "created_at", "kind", "user_id", "run_id", "tool_call_id", "tool", "arguments", "arguments_sha256",
    "outcome", "duration_ms", "approval_id", "request_id", "error_id", "detail",
    "chain_seq", "content_hash", "prev_hash", "chain_hash", "hash_version",
)
_REDACTED_VALUE = sa.literal_column(f"""'$.** ? (@ == "{REDACTED}")'::jsonpath""")


def _arguments_hidden(events: Any) -> sa.ColumnElement[bool]:
    """The row's arguments are hashed but not shown whole: a field redacted as sensitive, or
    refused and never stored."""
    arguments = events.c.arguments
    return sa.and_(
        events.c.arguments_sha256.is_not(None),
        sa.or_(
            arguments.is_(None),
            sa.func.jsonb_typeof(arguments) != "object",
            sa.func.jsonb_path_exists(arguments, _REDACTED_VALUE),
        ),
    )


_SHOWN: dict[str, Any] = {
    "arguments_sha256": sa.case(
        (_arguments_hidden(audit_events), sa.null()), else_=audit_events.c.arguments_sha256
    ).label("arguments_sha256"),
    "detail": sa.case(
        (sa.func.jsonb_typeof(audit_events.c.detail) == "object",
         audit_events.c.detail.op("-")(sa.literal_column("'stored_arguments_sha256'"))),
        else_=audit_events.c.detail,
    ).label("detail"),
    # Every chain hash covers every row before it in the tenant's chain, and so any hash of a
    # hidden value there: given the rows' other fields, each would test guesses of that value.
    # They are the operator's (``gateway audit verify``, the console's chain check).
    **{name: sa.null().label(name) for name in ("content_hash", "prev_hash", "chain_hash")},
}
"""What a reader is shown of a row (the API's listing and export, the console): what the row
keeps, but no hash of a value the reader does not see. The sha256 of a four-digit PIN is the
PIN to anyone who tries the 10,000, and so is any hash that covers it. The row keeps them all,
the chain covers them, and ``audit verify`` checks them."""

_columns = tuple(
    _SHOWN.get(name, audit_links.c[name] if name in CHAIN_FIELDS else audit_events.c[name])
    for name in EXPORT_COLUMNS
)
_with_links = audit_events.outerjoin(
    audit_links,
    sa.and_(
        audit_links.c.tenant_id == audit_events.c.tenant_id,
        audit_links.c.audit_id == audit_events.c.id,
        audit_links.c.created_at == audit_events.c.created_at,
    ),
)


@dataclass(frozen=True, slots=True)
class AuditFilters:
    user: str | None = None
    tool: str | None = None
    outcome: str | None = None
    run: str | None = None
    approval: str | None = None
    since: datetime | None = None
    """Rows at or after this time."""
    until: datetime | None = None
    """Rows before this time."""


def select_rows(tenant_id: str, filters: AuditFilters, *, before_id: int | None = None) -> sa.Select[Any]:
    """The tenant's rows matching ``filters``, newest (highest id) first."""
    c = audit_events.c
    stmt = sa.select(*_columns).select_from(_with_links).where(c.tenant_id == tenant_id)
    for column, value in (
        (c.user_id, filters.user),
        (c.tool, filters.tool),
        (c.outcome, filters.outcome),
        (c.run_id, filters.run),
        (c.approval_id, filters.approval),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if filters.since is not None:
        stmt = stmt.where(c.created_at >= filters.since)
    if filters.until is not None:
        stmt = stmt.where(c.created_at < filters.until)
    if before_id is not None:
        stmt = stmt.where(c.id < before_id)
    return stmt.order_by(c.id.desc())


async def page(
    conn: AsyncConnection, *, tenant_id: str, filters: AuditFilters, limit: int, before_id: int | None
) -> tuple[list[Any], bool]:
    """One page of ``limit`` rows and whether more follow."""
    rows = list((await conn.execute(select_rows(tenant_id, filters, before_id=before_id).limit(limit + 1))).all())
    return rows[:limit], len(rows) > limit
