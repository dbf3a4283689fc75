"""The delivery worker's claim reads each tenant's due deliveries through an index of its own.

The claim in which tenants take turns (``gateway.webhooks.store._CLAIM``) numbered every due
and in-flight delivery of every tenant and sorted them, so its cost grew with a backlog (with
100,000 deliveries due for one tenant: sorts spilled to disk, about 300 ms a claim, and a
process claims as each delivery ends). ``ix_webhook_deliveries_tenant_due`` indexes the
deliveries pending or in flight by ``(tenant_id, next_attempt_at, id)``: the claim finds the
tenants one probe each and reads each tenant's due deliveries oldest first, only as far as it
claims. The index leads with ``tenant_id``; the worker's due list across tenants
(``ix_webhook_deliveries_due``) stays, for ``work_to_do`` and the count of deliveries in flight.

Downgrade drops the index; the claim of this release then finds its rows without it: still
correct, no longer cheap.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_webhook_deliveries_tenant_due ON webhook_deliveries (tenant_id, next_attempt_at, id) "
        "WHERE state IN ('pending', 'in_flight')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_webhook_deliveries_tenant_due")
