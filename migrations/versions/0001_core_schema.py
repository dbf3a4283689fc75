"""Core schema: tenants, roles, users, runs, tool calls, approvals, articles, audit.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("disabled", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("max_tool_calls_per_run", sa.Integer(), server_default=sa.text("100000"), nullable=False),
        sa.Column("max_repeats_per_call", sa.Integer(), server_default=sa.text("100"), nullable=False),
        sa.Column("max_run_ttl_s", sa.Integer(), server_default=sa.text("2592000"), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
    )
    op.create_table(
        "roles",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("description", sa.String(500), server_default="", nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_roles_tenant_id_tenants", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "name", name="pk_roles"),
    )
    op.create_table(
        "role_permissions",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("role", sa.String(64), nullable=False),
        sa.Column("permission", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "role"], ["roles.tenant_id", "roles.name"],
            name="fk_role_permissions_tenant_id_role_roles", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "role", "permission", name="pk_role_permissions"),
    )
    op.create_table(
        "users",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("display_name", sa.String(200), server_default="", nullable=False),
        sa.Column("roles", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_users_tenant_id_tenants", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_users"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("max_tool_calls", sa.Integer(), nullable=False),
        sa.Column("max_repeats", sa.Integer(), nullable=False),
        sa.Column("used_tool_calls", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_runs_tenant_id_tenants", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_tenant_id_user_id_created_at", "runs", ["tenant_id", "user_id", "created_at"])
    op.create_table(
        "run_call_counts",
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("call_hash", sa.String(64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        # No foreign key to runs, here and on tool_calls: rows are written only by the ledger
        # while it holds the run's lock, and a referential check per call was a measurable
        # share of the hot path's database time.
        sa.PrimaryKeyConstraint("run_id", "call_hash", name="pk_run_call_counts"),
    )
    op.create_table(
        "tool_calls",
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(40), nullable=True),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("approval_id", sa.String(40), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("run_id", "tool_call_id", name="pk_tool_calls"),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("requester_id", sa.String(128), nullable=False),
        sa.Column("requester_roles", JSON, nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("arguments", JSON, nullable=False),
        sa.Column("arguments_sha256", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=False),
        sa.Column("decided_by", sa.String(128), nullable=True),
        sa.Column("decided_at", TIMESTAMP, nullable=True),
        sa.Column("reason", sa.String(1000), nullable=True),
        sa.Column("outcome", sa.String(40), nullable=True),
        sa.Column("outcome_content", sa.Text(), nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_approvals_run_id_runs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_approvals_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.UniqueConstraint("run_id", "tool_call_id", name="uq_approvals_run_id_tool_call_id"),
    )
    op.create_index("ix_approvals_tenant_id_status_created_at", "approvals", ["tenant_id", "status", "created_at"])
    op.create_table(
        "articles",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("author_id", sa.String(128), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_articles_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_articles"),
    )
    op.create_index("ix_articles_tenant_id_created_at", "articles", ["tenant_id", "created_at"])
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=True),
        sa.Column("run_id", sa.String(40), nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=True),
        sa.Column("tool", sa.String(128), nullable=True),
        sa.Column("arguments", JSON, nullable=True),
        sa.Column("arguments_sha256", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(40), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("approval_id", sa.String(40), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("error_id", sa.String(40), nullable=True),
        sa.Column("detail", JSON, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_events"),
    )
    op.create_index("ix_audit_events_tenant_id_id", "audit_events", ["tenant_id", "id"])
    op.create_index("ix_audit_events_tenant_id_run_id", "audit_events", ["tenant_id", "run_id"])


def downgrade() -> None:
    for table in (
        "audit_events", "articles", "approvals", "tool_calls", "run_call_counts", "runs",
        "users", "role_permissions", "roles", "tenants",
    ):
        op.drop_table(table)
