"""A link's chain hash covers the time of its row (link-hash version 2).

A link's ``chain_hash`` covered its position, the previous hash and its row's content hash,
which covers the row's ``created_at``; but once retention has dropped a row, its link is all
that is left, and the link's own ``created_at`` (the dropped row's time, which decides whether
``audit verify`` takes a missing row for a pruned one) was covered by no hash: someone with the
owner's rights could delete a row of the oldest kept month and date its link back into a
dropped month. ``audit_links.hash_version`` says how a link's hash was made: 2 (what this
release's sealer writes) hashes the time too, 1 is every link sealed before. The column's
default stays 1, so a sealer of the release before that still runs during a rolling upgrade
writes links that verify as what they are. A link changed from 2 to 1 no longer matches its
own chain hash, so the version cannot be lowered unseen either.

Adding a column with a constant default rewrites nothing (PostgreSQL 11+), and the check on it
is validated apart (``VALIDATE CONSTRAINT`` reads every link, but under a lock that lets the
sealer and readers go on). During a rolling upgrade, ``audit verify`` of the release before
reports a chain broken at its first version-2 link: verify with this release.

Downgrade drops the column, and refuses while any link of version 2 exists: the release
before would read it as version 1 and report the chain broken there.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE audit_links ADD COLUMN hash_version smallint DEFAULT 1 NOT NULL")
    # Checked without the table's exclusive lock: NOT VALID first (instant), then VALIDATE,
    # which reads every link under a lock that lets the sealer and readers go on.
    op.execute(
        "ALTER TABLE audit_links ADD CONSTRAINT ck_audit_links_hash_version CHECK (hash_version IN (1, 2)) NOT VALID"
    )
    op.execute("ALTER TABLE audit_links VALIDATE CONSTRAINT ck_audit_links_hash_version")


def downgrade() -> None:
    # No sealer of this release may add a version-2 link between the check and the drop.
    op.execute("LOCK TABLE audit_links IN SHARE MODE")
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM audit_links WHERE hash_version <> 1) THEN
                RAISE EXCEPTION 'audit links sealed with hash version 2 exist: the release before cannot verify them'
                    USING HINT = 'downgrade only a database this release has not sealed into';
            END IF;
        END
        $$
        """
    )
    op.execute("ALTER TABLE audit_links DROP COLUMN hash_version")
