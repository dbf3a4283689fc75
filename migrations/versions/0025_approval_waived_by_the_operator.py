"""Only the operator waives approval for a tool that changes data.

``approval_mode = 'never'`` let a tool's calls run without approval whoever set it. The
tenant administrator's API and console refused it for a tool that changes data, but
allowed it for one that reads only, and kept it when the tool later changed data (an MCP
server's ``destructiveHint``, a changed tools file): the calls then ran unapproved.
``approval_waived`` records the operator's grant (``gateway tenants approval-mode ...
never``); ``never`` without it counts as ``mutating`` for a tool that changes data.

Upgrade sets it on the policies the operator wrote last with ``never``. A ``never`` a tenant
administrator saved since (keeping the operator's grant while changing another field) loses
it: the tool's calls wait for approval again until the operator grants it once more — the
safe side, as the release notes say.

Downgrade drops the column (every ``never`` is a waiver again).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tool_policies", sa.Column("approval_waived", sa.Boolean, nullable=False, server_default=sa.false()))
    op.execute(
        "UPDATE tool_policies SET approval_waived = true "
        "WHERE approval_mode = 'never' AND updated_by = 'operator:cli'"
    )


def downgrade() -> None:
    op.drop_column("tool_policies", "approval_waived")
