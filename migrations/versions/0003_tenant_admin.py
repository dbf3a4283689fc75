"""Tenant administration and tamper evidence: tool policies, and the audit hash chain.

- ``tool_policies``: one row per (tenant, tool) that differs from the defaults.
- ``audit_events`` gains the chain columns a sealer fills in off the request path
  (``chain_seq``, ``content_hash``, ``prev_hash``, ``chain_hash``); the hot path still only
  inserts rows. A partial index finds the unsealed rows, a partial unique index makes a
  position in a tenant's chain impossible to hand out twice.
- ``audit_chains``: each tenant's chain head (what the last sealed row hashed to) and its
  anchor (where the chain starts after old rows were pruned).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
BIGINT = sa.BigInteger()


def upgrade() -> None:
    op.create_table(
        "tool_policies",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("approval_mode", sa.String(16), server_default="mutating", nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("max_calls_per_run", sa.Integer(), nullable=True),
        sa.Column("max_result_bytes", sa.Integer(), nullable=True),
        sa.Column("allowed_roles", JSON, nullable=True),
        sa.Column("updated_by", sa.String(128), nullable=True),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "approval_mode IN ('never', 'mutating', 'always')", name="ck_tool_policies_approval_mode"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_tool_policies_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "tool", name="pk_tool_policies"),
    )
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("chain_seq", BIGINT, nullable=True))
        batch.add_column(sa.Column("content_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("prev_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("chain_hash", sa.String(64), nullable=True))
    op.create_index(
        "ix_audit_events_unsealed",
        "audit_events",
        ["id"],
        postgresql_where=sa.text("chain_seq IS NULL"),
    )
    op.create_index(
        "uq_audit_events_tenant_id_chain_seq",
        "audit_events",
        ["tenant_id", "chain_seq"],
        unique=True,
        postgresql_where=sa.text("chain_seq IS NOT NULL"),
    )
    op.create_table(
        "audit_chains",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("head_seq", BIGINT, nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("anchor_seq", BIGINT, nullable=False),
        sa.Column("anchor_hash", sa.String(64), nullable=False),
        sa.Column("pruned_rows", BIGINT, server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_audit_chains"),
    )


def downgrade() -> None:
    op.drop_table("audit_chains")
    op.drop_index("uq_audit_events_tenant_id_chain_seq", table_name="audit_events")
    op.drop_index("ix_audit_events_unsealed", table_name="audit_events")
    with op.batch_alter_table("audit_events") as batch:
        for column in ("chain_hash", "prev_hash", "content_hash", "chain_seq"):
            batch.drop_column(column)
    op.drop_table("tool_policies")
