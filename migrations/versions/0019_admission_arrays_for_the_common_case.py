"""The common case of an admission takes its calls as typed arrays.

``gateway_admit_common_calls`` holds the common case's statements (lock the runs, check the
ids, count, claim, audit), taking each call's fields as arrays; the gateway calls it directly
when its batches are the common case, so PostgreSQL neither parses the batches' JSON nor
starts the aggregates that unpack it: measured on one connection, an admission of one call
cost 0.56-0.80× the server CPU it cost as JSON, of four 0.79-0.88×, of sixteen 0.79-0.92×.
When the database finds the case not common after all, the function decides the calls one by
one in the same statement, from the batches' JSON passed along as text.
``gateway_admit_calls`` unpacks its JSON as before and hands the common case to the new
function, so there is one body for it.

Applied from its file. Downgrade leaves both functions: ``gateway_admit_calls`` answers as that
of 0018.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("admit_calls.sql")


def downgrade() -> None:
    """Nothing to undo: gateway_admit_calls of 0019 answers as that of 0018."""
