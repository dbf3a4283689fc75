"""The admission finds each run through its primary key alone, whatever plan it keeps.

``gateway_admit_calls`` and ``gateway_admit_calls_one_by_one`` looked a run up by id, tenant
and user, all three as equalities. A generic plan made while ``runs`` was small and not yet
analyzed (a new install) served the lookup from ``(tenant_id, user_id, created_at)``, and the
connection kept that plan: for each run it locked, an admission then read the caller's runs
in order of creation up to that one, live and dead, a cost growing with how many runs a user
has (measured on one connection: 16 calls of a user with 2,000 older runs cost 2.8–3.2 ms of
server CPU against 1.0–1.1 ms by the primary key, as with no older runs). The owner is now compared with ``IS NOT DISTINCT FROM``, which no index serves,
so the primary key is the only way in; the answers are the same (the columns are NOT NULL).

Applied from its file. Downgrade leaves the functions as they are: they answer as those of
0016 and need nothing 0017 adds.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_sql_file("admit_calls.sql")


def downgrade() -> None:
    """Nothing to undo: the lookups of 0017 give the answers of 0016's."""
