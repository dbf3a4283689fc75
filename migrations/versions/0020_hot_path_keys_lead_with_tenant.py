"""The hot path's tables are keyed by tenant first.

``runs`` was keyed by ``id``, ``tool_calls`` by ``(run_id, tool_call_id)``, ``run_call_counts``
by ``(run_id, call_hash)``, ``approvals`` by ``id`` and ``run_messages`` by ``(run_id, seq)``.
Each key now leads with ``tenant_id`` (``run_call_counts`` gains the column, filled from its
run), so a tenant's rows of every hot-path table sit together in its indexes and the schema
can be distributed by tenant (Citus and its like require the distribution column in every
unique key). The foreign keys to ``runs`` become ``(tenant_id, run_id)``, so a row can no
longer name another tenant's run; ``approvals``' one approval per call becomes one per
``(tenant_id, run_id, tool_call_id)``. Every lookup names the tenant (the functions of
``admit_calls.sql`` and ``record_calls.sql``, applied again here, and ``gateway.db``), so it
goes through the new key. Ids are still made unique by the gateway (random); a run or approval
id is now unique within its tenant only by that.

The webhook tables likewise: ``webhook_subscriptions`` and ``webhook_deliveries`` are keyed by
``(tenant_id, id)``, a delivery names its subscription by ``(tenant_id, subscription_id)``, and
a subscription's deliveries are indexed by ``(tenant_id, subscription_id, created_at)``; the
worker's due list (``state, next_attempt_at``) stays across tenants.

Counts of runs that no longer exist (a deleted tenant's: the table has no foreign key) are
dropped: no run can read them.

Downgrade restores the keys of 0019 and leaves the functions applied here, which work on both:
they name the keys of their upserts by constraint (``pk_tool_calls``, ``pk_run_call_counts``:
the same names before and after) and their lookups by tenant are served by the older keys too.
``run_call_counts.tenant_id`` stays, nullable, since those functions write it. Downgrading
fails once two tenants have runs, approvals, subscriptions or deliveries of one id, which
0020 allows.

Upgrading rebuilds seven primary keys and checks four foreign keys in one transaction,
holding their tables' locks: the release before it cannot admit calls meanwhile, and once it
is done that release's lookups by id alone no longer have an index. Stop the old release
before running it (docs/operations.md).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REFERRING = (("run_messages", "CASCADE"), ("approvals", "CASCADE"), ("mcp_token_runs", "CASCADE"))
"""The tables whose ``run_id`` refers to ``runs``, and what deleting the run does to them."""

_OLD_DELIVERY_FK = "fk_webhook_deliveries_subscription_id_webhook_subscriptions"
_DELIVERY_FK = "fk_webhook_deliveries_tenant_id_subscription_id"
"""Named, as the naming convention's name would pass PostgreSQL's 63 characters."""


def upgrade() -> None:
    # The column stays on downgrade: upgrading again fills what was written without it.
    op.execute("ALTER TABLE run_call_counts ADD COLUMN IF NOT EXISTS tenant_id varchar(64)")
    op.execute(
        "UPDATE run_call_counts c SET tenant_id = r.tenant_id FROM runs r "
        "WHERE r.id = c.run_id AND c.tenant_id IS NULL"
    )
    op.execute("DELETE FROM run_call_counts WHERE tenant_id IS NULL")
    op.execute("ALTER TABLE run_call_counts ALTER COLUMN tenant_id SET NOT NULL")
    _rekey("run_call_counts", "tenant_id, run_id, call_hash")
    _rekey("tool_calls", "tenant_id, run_id, tool_call_id")

    for table, _ in _REFERRING:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT fk_{table}_run_id_runs")
    _rekey("runs", "tenant_id, id")
    _rekey("run_messages", "tenant_id, run_id, seq")
    _rekey("approvals", "tenant_id, id")
    op.execute(
        "ALTER TABLE approvals DROP CONSTRAINT uq_approvals_run_id_tool_call_id, "
        "ADD CONSTRAINT uq_approvals_tenant_id_run_id_tool_call_id UNIQUE (tenant_id, run_id, tool_call_id)"
    )
    for table, on_delete in _REFERRING:
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_tenant_id_run_id_runs "
            f"FOREIGN KEY (tenant_id, run_id) REFERENCES runs (tenant_id, id) ON DELETE {on_delete}"
        )

    op.execute(f"ALTER TABLE webhook_deliveries DROP CONSTRAINT {_OLD_DELIVERY_FK}")
    _rekey("webhook_subscriptions", "tenant_id, id")
    op.execute("DROP INDEX ix_webhook_subscriptions_tenant_id")  # the new key's prefix serves it
    _rekey("webhook_deliveries", "tenant_id, id")
    op.execute("DROP INDEX ix_webhook_deliveries_subscription")
    op.execute(
        "CREATE INDEX ix_webhook_deliveries_subscription ON webhook_deliveries (tenant_id, subscription_id, created_at)"
    )
    op.execute(
        f"ALTER TABLE webhook_deliveries ADD CONSTRAINT {_DELIVERY_FK} FOREIGN KEY (tenant_id, subscription_id) "
        "REFERENCES webhook_subscriptions (tenant_id, id) ON DELETE CASCADE"
    )

    apply_sql_file("admit_calls.sql")
    apply_sql_file("record_calls.sql")


def downgrade() -> None:
    op.execute(f"ALTER TABLE webhook_deliveries DROP CONSTRAINT {_DELIVERY_FK}")
    op.execute("DROP INDEX ix_webhook_deliveries_subscription")
    op.execute("CREATE INDEX ix_webhook_deliveries_subscription ON webhook_deliveries (subscription_id, created_at)")
    _rekey("webhook_deliveries", "id")
    op.execute("CREATE INDEX ix_webhook_subscriptions_tenant_id ON webhook_subscriptions (tenant_id)")
    _rekey("webhook_subscriptions", "id")
    op.execute(
        f"ALTER TABLE webhook_deliveries ADD CONSTRAINT {_OLD_DELIVERY_FK} FOREIGN KEY (subscription_id) "
        "REFERENCES webhook_subscriptions (id) ON DELETE CASCADE"
    )
    for table, _ in _REFERRING:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT fk_{table}_tenant_id_run_id_runs")
    op.execute(
        "ALTER TABLE approvals DROP CONSTRAINT uq_approvals_tenant_id_run_id_tool_call_id, "
        "ADD CONSTRAINT uq_approvals_run_id_tool_call_id UNIQUE (run_id, tool_call_id)"
    )
    _rekey("approvals", "id")
    _rekey("run_messages", "run_id, seq")
    _rekey("runs", "id")
    for table, on_delete in _REFERRING:
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_run_id_runs "
            f"FOREIGN KEY (run_id) REFERENCES runs (id) ON DELETE {on_delete}"
        )
    _rekey("tool_calls", "run_id, tool_call_id")
    _rekey("run_call_counts", "run_id, call_hash")
    op.execute("ALTER TABLE run_call_counts ALTER COLUMN tenant_id DROP NOT NULL")


def _rekey(table: str, columns: str) -> None:
    op.execute(
        f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}, ADD CONSTRAINT pk_{table} PRIMARY KEY ({columns})"
    )
