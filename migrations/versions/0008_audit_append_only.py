"""The database refuses to change or delete audit rows (``gateway/db/sql/audit_append_only.sql``).

Only the sealer may fill in the chain columns of a row not yet sealed, and only rows that
are sealed and behind their tenant's anchor may be deleted (what the prune does, after it
moves the anchor).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("audit_append_only.sql")


def downgrade() -> None:
    op.execute("DROP TRIGGER audit_events_append_only_delete ON audit_events")
    op.execute("DROP TRIGGER audit_events_append_only_update ON audit_events")
    op.execute("DROP FUNCTION gateway_audit_guard_delete()")
    op.execute("DROP FUNCTION gateway_audit_guard_update()")
