"""A pruned chain's start keeps the link it replaced, so its time can be checked.

After a prune, a tenant's chain starts at the chain hash of the last row of the dropped
months (``audit_chains.anchor_seq`` / ``anchor_hash``). ``audit verify`` trusted that start
for what was gone: someone with the tables' owner's rights could move it over rows of a
month still kept, delete those rows and their links, write a prune record naming the new
start, and a signed anchor after it still verified. The start now keeps the link it
replaced (its previous hash, content hash, time and hash version): verify recomputes the
start's hash from it and requires its time to lie before the oldest month kept, which
only dropping that month's partition can move. A start written by an earlier release has
none (NULL); ``gateway audit anchor`` signs the start too, and verify accepts such a start
only where it has not moved since a signed anchor that names it.

Downgrade drops the columns.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("start_prev_hash", sa.String(64)),
    ("start_content_hash", sa.String(64)),
    ("start_linked_at", sa.DateTime(timezone=True)),
    ("start_hash_version", sa.SmallInteger()),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("audit_chains", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(_COLUMNS):
        op.drop_column("audit_chains", name)
