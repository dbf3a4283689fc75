"""Agent loop: a run's loop state, usage and history; tenants' model settings.

- ``runs`` gains the loop's columns (all nullable or defaulted: a run driven by a client
  through ``/tool-calls`` leaves them empty): its state and stop reason, the provider and
  model it talks to, its loop limits, the model rounds and tokens used, how many history
  messages were dropped to fit the context window, and the request's sampling options.
- ``run_messages`` holds the history, one row per message, appended round by round.
- ``tenants`` gains ``allow_client_tools`` (a request may bring its own ``tools``) and
  ``llm_provider`` (the tenant is pinned to that provider).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)

RUN_COLUMNS = (
    "loop_state", "stop_reason", "provider", "model", "max_steps", "max_total_tokens", "timeout_s",
    "steps", "prompt_tokens", "completion_tokens", "messages_dropped", "loop_options", "updated_at",
)


def upgrade() -> None:
    op.add_column("tenants", sa.Column("allow_client_tools", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("tenants", sa.Column("llm_provider", sa.String(64), nullable=True))

    op.add_column("runs", sa.Column("loop_state", sa.String(24), nullable=True))
    op.add_column("runs", sa.Column("stop_reason", sa.String(40), nullable=True))
    op.add_column("runs", sa.Column("provider", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("model", sa.String(200), nullable=True))
    op.add_column("runs", sa.Column("max_steps", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("max_total_tokens", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("timeout_s", sa.Float(), nullable=True))
    op.add_column("runs", sa.Column("steps", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("runs", sa.Column("prompt_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False))
    op.add_column(
        "runs", sa.Column("completion_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column("runs", sa.Column("messages_dropped", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("runs", sa.Column("loop_options", JSON, nullable=True))
    op.add_column("runs", sa.Column("updated_at", TIMESTAMP, nullable=True))

    op.create_table(
        "run_messages",
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("message", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_messages_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_messages"),
    )


def downgrade() -> None:
    op.drop_table("run_messages")
    with op.batch_alter_table("runs") as batch:
        for column in RUN_COLUMNS:
            batch.drop_column(column)
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("llm_provider")
        batch.drop_column("allow_client_tools")
