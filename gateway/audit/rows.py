"""The one writer of ``audit_events``: every attempt and decision is an ``AuditRow``.

Python paths build an ``AuditRow`` and call ``append_audit`` (or ``append_audit_where``,
when the row is written only if a condition holds, in the same statement). The hot path's SQL
functions write theirs through ``gateway_append_audit`` (``gateway/db/sql/append_audit.sql``),
which reads JSON objects whose keys are the fields of ``AuditRow``: Python sends the parts
it knows (``audit_json``: the batch's, the call's) and the function adds only what the
database decided (kind, outcome, approval, detail). A test keeps the fields, the table's
columns and the function's column list the same.

Rows are only inserted: triggers (migration 0013) refuse every UPDATE and DELETE. The sealer
links a row into its chain with a row of its own in ``audit_links``; retention drops whole
months of rows (partitions), never deletes one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import AuditEvent

audit_events = AuditEvent.__table__


class AuditRow(msgspec.Struct, kw_only=True, frozen=True):
    """One row of ``audit_events`` as written (``id`` and ``txid`` are the database's)."""

    tenant_id: str
    kind: str
    outcome: str
    created_at: datetime
    user_id: str | None = None
    run_id: str | None = None
    tool_call_id: str | None = None
    tool: str | None = None
    arguments: Any = None
    arguments_sha256: str | None = None
    duration_ms: float | None = None
    approval_id: str | None = None
    request_id: str | None = None
    error_id: str | None = None
    detail: dict[str, Any] | None = None


AUDIT_ROW_FIELDS: tuple[str, ...] = AuditRow.__struct_fields__
"""The columns an audit row is written with, in one order."""


def _bind_type(name: str) -> Any:
    """The column's type, except that a JSON column stores ``None`` as SQL NULL (as the hot
    path's SQL does), not as the JSON value ``null``."""
    column_type = audit_events.c[name].type
    if isinstance(column_type, sa.JSON):
        return sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
    return column_type


_BIND_TYPES = {name: _bind_type(name) for name in AUDIT_ROW_FIELDS}
_INSERT = sa.insert(audit_events).values(
    {name: sa.bindparam(name, type_=_BIND_TYPES[name]) for name in AUDIT_ROW_FIELDS}
)


def audit_values(row: AuditRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in AUDIT_ROW_FIELDS}


async def append_audit(conn: AsyncConnection, *rows: AuditRow) -> None:
    """Insert audit rows in the caller's transaction (the state change they describe commits with them)."""
    if rows:
        await conn.execute(_INSERT, [audit_values(row) for row in rows])


async def append_audit_where(conn: AsyncConnection, row: AuditRow, *where: sa.ColumnElement[bool]) -> bool:
    """Insert ``row`` only when ``where`` holds, in one statement; whether it was inserted."""
    values = sa.select(
        *(sa.literal(getattr(row, name), _BIND_TYPES[name]) for name in AUDIT_ROW_FIELDS)
    ).where(*where)
    result = await conn.execute(sa.insert(audit_events).from_select(list(AUDIT_ROW_FIELDS), values))
    return bool(result.rowcount)


def audit_json(**fields: Any) -> dict[str, Any]:
    """Part of an audit row for the hot path's SQL, keyed by ``AuditRow`` field (times as
    ISO text, ``arguments`` already the JSON value to store); the SQL merges the parts of a
    batch, a call and its decision into one row."""
    unknown = fields.keys() - _FIELD_SET
    if unknown:
        raise TypeError(f"not columns of an audit row: {sorted(unknown)}")
    return {name: value.isoformat() if isinstance(value, datetime) else value for name, value in fields.items()}


_FIELD_SET = frozenset(AUDIT_ROW_FIELDS)
