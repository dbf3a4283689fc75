"""The claim of a call that changes nothing commits without waiting for its WAL flush.

``gateway_admit_calls`` marks a statement whose every call is admitted to run a read-only
tool (and that writes no audit row) ``synchronous_commit = off`` for its own transaction:
the call's answer waits for the recording statement, which commits durably and, WAL being
written in order, makes the claim durable with it.

Applied from its file. Downgrade leaves it: a caller of 0013 sends no ``read_only`` flag,
and without it every statement commits durably, as before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("admit_calls.sql")


def downgrade() -> None:
    """Nothing to undo: the function of 0014 answers 0013's callers unchanged."""
