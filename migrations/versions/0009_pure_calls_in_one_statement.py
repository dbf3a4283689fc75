"""A pure tool's call is admitted, stored and audited in one statement; the hot path's
helper functions keep their plans.

- ``gateway_admit_calls`` accepts a call's outcome computed ahead (``result``) for tools
  that do no I/O and change nothing: admitted, it is stored and audited at once, and the
  call needs no ``gateway_record_calls``.
- ``gateway_append_audit`` and ``gateway_record_calls`` are PL/pgSQL instead of SQL, so a
  session plans their statements once (a SQL function called from another function is
  parsed and planned again at every call).

Applied from their files. Downgrade leaves them: each accepts everything 0008's did and
answers it the same way (a batch without ``result`` is admitted as before).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("append_audit.sql")
    apply_sql_file("admit_calls.sql")
    apply_sql_file("record_calls.sql")


def downgrade() -> None:
    """Nothing to undo: the functions of 0009 serve 0008's callers unchanged."""
