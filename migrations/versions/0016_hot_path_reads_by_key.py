"""The hot path's functions never scan runs, tool_calls, run_call_counts or approvals.

A session keeps the plans of a PL/pgSQL function's statements (``gateway_admit_calls`` makes
generic ones). A plan made while a table held a few rows, as on a new install, chose to scan
it (runs, in the set-based admission's lock and update), and that connection went on
scanning it at every statement as the table grew. ``gateway_admit_calls``,
``gateway_admit_calls_one_by_one`` and ``gateway_record_calls`` now run with
``enable_seqscan`` off, so every plan reads through the primary keys.

Applied from their files. Downgrade takes the setting off the three functions again (the
functions of 0015).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("admit_calls.sql")
    apply_sql_file("record_calls.sql")


def downgrade() -> None:
    for function in ("gateway_admit_calls", "gateway_admit_calls_one_by_one", "gateway_record_calls"):
        op.execute(f"ALTER FUNCTION {function} RESET enable_seqscan")
