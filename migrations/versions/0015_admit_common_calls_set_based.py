"""The admission statement decides its common case set-based: every call new, refused by no
check, needing no approval, with no tool cap, within its run's budget and repeat limit.

``gateway_admit_calls`` then claims all the statement's calls in one INSERT, counts them in
one upsert and one UPDATE of their runs, and audits the calls that came with their outcome in
one append, instead of two statements per call and two per run. Anything else is decided,
before anything is written, by the loop that decided every statement before:
``gateway_admit_calls_one_by_one`` (the function of 0014 under another name), so the answers,
rows and audit rows are the same.

Applied from its file. Downgrade drops the set-based function and gives the loop its name
back: the function of 0014.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("admit_calls.sql")


def downgrade() -> None:
    op.execute("DROP FUNCTION gateway_admit_calls(jsonb, jsonb)")
    op.execute("ALTER FUNCTION gateway_admit_calls_one_by_one(jsonb, jsonb) RENAME TO gateway_admit_calls")
