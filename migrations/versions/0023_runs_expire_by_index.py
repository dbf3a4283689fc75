"""Runs are found by their expiry, for retention (``gateway runs prune``).

Runs were never deleted: each one, with its tool calls, repeat counts, messages and
approvals, stayed for ever, and every MCP ``initialize`` makes one. The prune removes the
runs that expired before a given age, oldest first, in batches; ``ix_runs_expires_at``
finds them without reading the whole table. It is across tenants by design, like the
console's expired sessions.

Downgrade drops the index.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_runs_expires_at", "runs", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_expires_at", table_name="runs")
