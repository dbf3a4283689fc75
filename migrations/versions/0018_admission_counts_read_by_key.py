"""The set-based admission reads each call's earlier count by key instead of joining the
calls to its upsert's RETURNING.

That join had no index to use and, hash and merge joins being off in the function, ran as a
nested loop over the whole RETURNING set for every call: its cost grew with the square of the
statement's calls (measured on one connection, server CPU per call of an admission of 512
calls: 105 µs, of 80 calls: 87 µs; read by key: 63 and 71 µs). A call's count is now its
run's count of its hash before the statement, read through the primary key (every part of a
statement sees the rows as they were when it began, and they are written only under the run's
lock, which the transaction holds, taken by an earlier statement), plus its place among the statement's calls of that hash:
the same number as before.

Applied from its file. Downgrade leaves the function as it is: it answers as that of 0017.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("admit_calls.sql")


def downgrade() -> None:
    """Nothing to undo: the counts of 0018 are those of 0017."""
