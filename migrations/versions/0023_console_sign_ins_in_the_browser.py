"""The console's OpenID Connect sign-ins under way live in the browser, not in a table.

``GET /console/oidc/start`` is open to anyone, and it wrote a ``console_sign_ins`` row per
request, kept for ten minutes: anyone could grow the table (and the WAL) as fast as they
could send requests. A sign-in under way is now the value of its browser's cookie
(``gateway.console.oidc``), so the table goes.

Downgrade creates the table again, empty: sign-ins under way at the downgrade are lost (their
users start again), as they would be at any restart of the earlier release past ten minutes.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("console_sign_ins")


def downgrade() -> None:
    op.create_table(
        "console_sign_ins",
        sa.Column("state_hash", sa.String(64), nullable=False),
        sa.Column("nonce", sa.String(64), nullable=False),
        sa.Column("code_verifier", sa.String(128), nullable=False),
        sa.Column("browser_hash", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("state_hash", name="pk_console_sign_ins"),
    )
