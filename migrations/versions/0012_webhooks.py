"""Webhooks: tenants' subscriptions and the outbox their deliveries are sent from.

``webhook_subscriptions`` holds where a tenant's events go and the secret that signs them;
``webhook_deliveries`` is the outbox, one row per event and subscription, written by the
triggers of ``gateway/db/sql/webhook_outbox.sql`` in the transaction of the change it
announces, and sent by the delivery worker of every gateway process.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("events", JSONB(), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("description", sa.String(500), server_default="", nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("format IN ('standard', 'slack')", name="ck_webhook_subscriptions_format"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_webhook_subscriptions_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_subscriptions"),
    )
    op.create_index("ix_webhook_subscriptions_tenant_id", "webhook_subscriptions", ["tenant_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("subscription_id", sa.String(40), nullable=False),
        sa.Column("event_type", sa.String(40), nullable=False),
        sa.Column("data", JSONB(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", TIMESTAMP, nullable=False),
        sa.Column("window_started_at", TIMESTAMP, nullable=False),
        sa.Column("last_attempt_at", TIMESTAMP, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(64), nullable=True),
        sa.Column("delivered_at", TIMESTAMP, nullable=True),
        sa.Column("dead_at", TIMESTAMP, nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'in_flight', 'delivered', 'dead')", name="ck_webhook_deliveries_state"
        ),
        sa.ForeignKeyConstraint(
            ["subscription_id"], ["webhook_subscriptions.id"],
            name="fk_webhook_deliveries_subscription_id_webhook_subscriptions", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_subscription", "webhook_deliveries", ["subscription_id", "created_at"])
    apply_sql_file("webhook_outbox.sql")


def downgrade() -> None:
    op.execute("DROP TRIGGER runs_webhook_stopped ON runs")
    op.execute("DROP TRIGGER approvals_webhook_status ON approvals")
    op.execute("DROP TRIGGER approvals_webhook_created ON approvals")
    op.execute("DROP FUNCTION gateway_webhook_run_event()")
    op.execute("DROP FUNCTION gateway_webhook_approval_event()")
    op.execute("DROP FUNCTION gateway_webhook_enqueue(text, text, jsonb)")
    op.execute("DROP FUNCTION gateway_webhook_time(timestamptz)")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_subscriptions")
