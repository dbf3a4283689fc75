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
only where it has not moved since a signed anchor that names it. During a rolling upgrade the
release before may still prune: it moves the start without these columns, so a trigger
clears them when the start moves and they do not (the start then reads as that release's).

Downgrade drops the trigger and the columns.

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
    op.execute(
        """
        CREATE FUNCTION gateway_audit_start_link_follows() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            NEW.start_prev_hash := NULL;
            NEW.start_content_hash := NULL;
            NEW.start_linked_at := NULL;
            NEW.start_hash_version := NULL;
            RETURN NEW;
        END;
        $fn$
        """
    )
    op.execute(
        """
        CREATE TRIGGER audit_chains_start_link_follows BEFORE UPDATE ON audit_chains FOR EACH ROW
        WHEN (NEW.anchor_seq IS DISTINCT FROM OLD.anchor_seq
              AND NEW.start_prev_hash IS NOT DISTINCT FROM OLD.start_prev_hash
              AND NEW.start_content_hash IS NOT DISTINCT FROM OLD.start_content_hash)
        EXECUTE FUNCTION gateway_audit_start_link_follows()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER audit_chains_start_link_follows ON audit_chains")
    op.execute("DROP FUNCTION gateway_audit_start_link_follows()")
    for name, _ in reversed(_COLUMNS):
        op.drop_column("audit_chains", name)
