"""Rate limits: shared token buckets per tenant and per user, and per-tenant overrides.

``rate_limit_buckets`` holds one token bucket per tenant (``user_id = ''``) and per user
of a tenant; every gateway process leases tokens from it in small chunks and spends them
locally (see ``gateway.ratelimit``). ``rate_limit_overrides`` replaces the configured rate
and burst of one tenant's buckets (scope ``tenant``: the tenant's own bucket; scope
``user``: each of its users' buckets).

``gateway_take_tokens`` refills and takes from several buckets in one statement, under
each bucket's row lock, with the database's clock.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)

TAKE_TOKENS = r"""
CREATE FUNCTION gateway_take_tokens(
    p_tenants text[], p_users text[], p_rates float8[], p_bursts float8[], p_wants integer[], p_now timestamptz
)
RETURNS TABLE (o_granted integer, o_wait_s float8, o_rate float8, o_burst float8)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := COALESCE(p_now, clock_timestamp());
    v_rate float8;
    v_burst float8;
    v_override_rate float8;
    v_override_burst float8;
    v_tokens float8;
    v_updated timestamptz;
BEGIN
    -- The caller orders the buckets (tenant, user): every statement locks rows in the same order.
    FOR i IN 1 .. COALESCE(array_length(p_tenants, 1), 0) LOOP
        v_rate := p_rates[i];
        v_burst := p_bursts[i];
        SELECT o.rate_per_s, o.burst INTO v_override_rate, v_override_burst
          FROM rate_limit_overrides o
         WHERE o.tenant_id = p_tenants[i] AND o.scope = CASE WHEN p_users[i] = '' THEN 'tenant' ELSE 'user' END;
        IF FOUND THEN
            v_rate := v_override_rate;
            v_burst := v_override_burst;
        END IF;

        SELECT b.tokens, b.updated_at INTO v_tokens, v_updated
          FROM rate_limit_buckets b
         WHERE b.tenant_id = p_tenants[i] AND b.user_id = p_users[i]
           FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO rate_limit_buckets (tenant_id, user_id, tokens, updated_at)
            VALUES (p_tenants[i], p_users[i], v_burst, v_now)
            ON CONFLICT DO NOTHING;
            SELECT b.tokens, b.updated_at INTO v_tokens, v_updated
              FROM rate_limit_buckets b
             WHERE b.tenant_id = p_tenants[i] AND b.user_id = p_users[i]
               FOR UPDATE;
        END IF;

        v_tokens := LEAST(v_burst, v_tokens + v_rate * GREATEST(0, EXTRACT(EPOCH FROM (v_now - v_updated))));
        o_granted := GREATEST(0, LEAST(p_wants[i], floor(v_tokens)::integer));
        v_tokens := v_tokens - o_granted;
        UPDATE rate_limit_buckets
           SET tokens = v_tokens, updated_at = GREATEST(v_updated, v_now)
         WHERE tenant_id = p_tenants[i] AND user_id = p_users[i];

        o_wait_s := CASE WHEN o_granted > 0 THEN 0 ELSE (1 - v_tokens) / v_rate END;
        o_rate := v_rate;
        o_burst := v_burst;
        RETURN NEXT;
    END LOOP;
END;
$fn$;
"""


def upgrade() -> None:
    op.create_table(
        "rate_limit_buckets",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", name="pk_rate_limit_buckets"),
    )
    op.create_table(
        "rate_limit_overrides",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("rate_per_s", sa.Float(), nullable=False),
        sa.Column("burst", sa.Integer(), nullable=False),
        sa.CheckConstraint("scope IN ('tenant', 'user')", name="ck_rate_limit_overrides_scope"),
        sa.CheckConstraint("rate_per_s > 0", name="ck_rate_limit_overrides_rate_positive"),
        sa.CheckConstraint("burst >= 1", name="ck_rate_limit_overrides_burst_positive"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_rate_limit_overrides_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "scope", name="pk_rate_limit_overrides"),
    )
    op.execute(TAKE_TOKENS)


def downgrade() -> None:
    op.execute("DROP FUNCTION gateway_take_tokens(text[], text[], float8[], float8[], integer[], timestamptz)")
    op.drop_table("rate_limit_overrides")
    op.drop_table("rate_limit_buckets")
