"""The default run of an MCP caller on the 2026-07-28 protocol, which has no sessions.

One run per (tenant, user, token): the token is named by its ``jti`` or, without one, by
the sha256 of the token itself; the run expires with the token. Every gateway process finds
the same run here, so two processes behind one load balancer count a caller's calls against
one budget.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "mcp_token_runs",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("token_key", sa.String(80), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_mcp_token_runs_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", "token_key", name="pk_mcp_token_runs"),
    )


def downgrade() -> None:
    op.drop_table("mcp_token_runs")
