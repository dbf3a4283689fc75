"""The one writer of ``audit_events``: every attempt and decision is an ``AuditRow``.

Python paths build an ``AuditRow`` and call ``append_audit``. The hot path's SQL
functions write theirs through ``gateway_append_audit`` (``gateway/db/sql/append_audit.sql``),
which reads JSON objects whose keys are the fields of ``AuditRow``: Python encodes the
part it knows (``AuditRow`` with ``kind`` and ``outcome`` left to the database) and the
function adds only what the database decided. A test keeps the fields, the table's
columns and the function's column list the same.

Rows are only inserted: a trigger (migration 0008) refuses any other change, except the
sealer linking a row into its chain and the prune removing a sealed prefix.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import AuditEvent

audit_events = AuditEvent.__table__


class AuditRow(msgspec.Struct, kw_only=True, frozen=True):
    """One row of ``audit_events`` as written (the chain's columns are the sealer's)."""

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


def audit_values(row: AuditRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in AUDIT_ROW_FIELDS}


async def append_audit(conn: AsyncConnection, *rows: AuditRow) -> None:
    """Insert audit rows in the caller's transaction (the state change they describe commits with them)."""
    if rows:
        await conn.execute(sa.insert(audit_events), [audit_values(row) for row in rows])


def audit_json(**fields: Any) -> dict[str, Any]:
    """Part of an audit row for the hot path's SQL, keyed by ``AuditRow`` field (times as
    ISO text, ``arguments`` already the JSON value to store); the SQL merges the parts of a
    batch, a call and its decision into one row."""
    unknown = fields.keys() - _FIELD_SET
    if unknown:
        raise TypeError(f"not columns of an audit row: {sorted(unknown)}")
    return {name: value.isoformat() if isinstance(value, datetime) else value for name, value in fields.items()}


_FIELD_SET = frozenset(AUDIT_ROW_FIELDS)
