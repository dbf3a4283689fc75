"""Approvals freeze their arguments as text; a reused tool_call_id must name the same call.

- ``approvals.canonical_arguments`` (text) replaces ``approvals.arguments`` (JSONB). JSONB
  rewrites numbers (``1e16`` becomes ``10000000000000000``, ``-0.0`` becomes ``0.0``), so
  arguments rebuilt from it no longer matched their sha256 and the approved call failed as
  tampered. The text is exactly what was hashed and exactly what executes. Existing rows
  get the text the executor used to rebuild (the JSONB re-encoded with sorted keys).
- ``tool_calls.arguments_sha256``: the hash of the call stored under a ``tool_call_id``,
  filled for existing rows from their audit row. ``gateway_admit_calls`` now answers a
  known id from storage only when tool and arguments hash match the stored call; any
  other call under that id gets ``TOOL_CALL_ID_CONFLICT``, is audited
  (``tool_call_conflict``) and runs nothing. A stored call without a hash (its audit row
  was pruned) matches nothing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import msgspec
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

ADMIT_CALLS = r"""
CREATE OR REPLACE FUNCTION gateway_admit_calls(p_now timestamptz, p_batches jsonb, p_contents jsonb,
                                    p_stale_before timestamptz)
RETURNS TABLE (
    o_batch integer,
    o_tool_call_id text,
    o_decision text,
    o_outcome text,
    o_content text,
    o_approval_id text,
    o_approval_status text
)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_batch jsonb;
    v_run record;
    v_run_id text;
    v_tenant_id text;
    v_user_id text;
    v_request_id text;
    v_call jsonb;
    v_id text;
    v_code text;
    v_count integer;
    v_tool_count integer;
    v_content_key text;
    v_used integer;
    v_existing tool_calls%ROWTYPE;
    v_approval_status text;
    v_approval_expires timestamptz;
    v_approval_decided timestamptz;
BEGIN
    o_batch := -1;
    -- The caller sorts the batches by run id, so concurrent statements lock runs in one order.
    FOR v_batch IN SELECT value FROM jsonb_array_elements(p_batches) LOOP
        o_batch := o_batch + 1;
        v_run_id := v_batch->>'run_id';
        v_tenant_id := v_batch->>'tenant_id';
        v_user_id := v_batch->>'user_id';
        v_request_id := v_batch->>'request_id';

        SELECT r.max_tool_calls, r.max_repeats, r.used_tool_calls, r.expires_at INTO v_run FROM runs r
         WHERE r.id = v_run_id AND r.tenant_id = v_tenant_id AND r.user_id = v_user_id
           FOR UPDATE;
        IF NOT FOUND THEN
            o_tool_call_id := NULL;
            o_decision := 'no_run';
            o_outcome := NULL;
            o_content := NULL;
            o_approval_id := NULL;
            o_approval_status := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_used := v_run.used_tool_calls;

        FOR v_call IN SELECT value FROM jsonb_array_elements(v_batch->'calls') LOOP
            v_id := v_call->>'id';
            o_tool_call_id := v_id;
            o_content := NULL;
            o_approval_id := NULL;
            o_approval_status := NULL;

            -- Claim the id first (the common case: a new call that will run); an id the run has
            -- seen is not claimed again and is answered from what is stored.
            INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, arguments_sha256, status, created_at)
            VALUES (v_run_id, v_id, v_tenant_id, v_call->>'tool', v_call->>'args_sha256', 'executing', p_now)
            ON CONFLICT (run_id, tool_call_id) DO NOTHING;
            IF NOT FOUND THEN
                SELECT * INTO v_existing FROM tool_calls t WHERE t.run_id = v_run_id AND t.tool_call_id = v_id;
                IF v_existing.tool IS DISTINCT FROM v_call->>'tool'
                   OR v_existing.arguments_sha256 IS DISTINCT FROM v_call->>'args_sha256' THEN
                    -- The id names another call: never answer it with that call's outcome, and run nothing.
                    o_decision := 'decided';
                    o_outcome := 'TOOL_CALL_ID_CONFLICT';
                    o_content := p_contents->>'TOOL_CALL_ID_CONFLICT';
                    INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                              arguments_sha256, outcome, request_id, detail, created_at)
                    VALUES (v_tenant_id, 'tool_call_conflict', v_user_id, v_run_id, v_id, v_call->>'tool',
                            v_call->'audit_args', v_call->>'args_sha256', o_outcome, v_request_id,
                            jsonb_build_object('stored_tool', v_existing.tool,
                                               'stored_arguments_sha256', v_existing.arguments_sha256),
                            p_now);
                    RETURN NEXT;
                    CONTINUE;
                END IF;
                o_decision := 'replay';
                o_content := v_existing.content;
                o_approval_id := v_existing.approval_id;
                o_outcome := v_existing.outcome;
                IF v_existing.outcome IS NULL THEN
                    IF v_existing.approval_id IS NOT NULL THEN
                        SELECT a.status, a.expires_at, a.decided_at
                          INTO v_approval_status, v_approval_expires, v_approval_decided
                          FROM approvals a WHERE a.id = v_existing.approval_id;
                        o_approval_status := v_approval_status;
                        o_outcome := CASE
                            WHEN v_approval_status = 'pending' AND v_approval_expires > p_now THEN 'APPROVAL_REQUIRED'
                            WHEN v_approval_status IN ('pending', 'expired') THEN 'APPROVAL_EXPIRED'
                            WHEN v_approval_status = 'rejected' THEN 'APPROVAL_REJECTED'
                            WHEN v_approval_decided < p_stale_before THEN 'TOOL_OUTCOME_UNKNOWN'
                            ELSE 'TOOL_CALL_IN_PROGRESS'
                        END;
                    ELSIF v_existing.created_at < p_stale_before THEN
                        -- Started long ago and never recorded: its process stopped while it ran.
                        o_outcome := 'TOOL_OUTCOME_UNKNOWN';
                    ELSE
                        o_outcome := 'TOOL_CALL_IN_PROGRESS';
                    END IF;
                END IF;
                INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                          arguments_sha256, outcome, approval_id, request_id, created_at)
                VALUES (v_tenant_id, 'tool_call_replay', v_user_id, v_run_id, v_id, v_call->>'tool',
                        v_call->'audit_args', v_call->>'args_sha256', o_outcome, o_approval_id, v_request_id, p_now);
                RETURN NEXT;
                CONTINUE;
            END IF;

            v_code := v_call->>'code';
            v_content_key := NULL;
            IF v_code IS NULL THEN
                IF v_run.expires_at IS NOT NULL AND v_run.expires_at <= p_now THEN
                    v_code := 'RUN_EXPIRED';
                ELSIF v_used >= v_run.max_tool_calls THEN
                    v_code := 'BUDGET_EXCEEDED';
                ELSE
                    v_used := v_used + 1;
                    INSERT INTO run_call_counts AS c (run_id, call_hash, count)
                    VALUES (v_run_id, v_call->>'call_hash', 1)
                    ON CONFLICT (run_id, call_hash) DO UPDATE SET count = c.count + 1
                    RETURNING c.count INTO v_count;
                    v_tool_count := 0;
                    IF v_call->>'tool_cap' IS NOT NULL THEN
                        INSERT INTO run_call_counts AS c (run_id, call_hash, count)
                        VALUES (v_run_id, 'tool:' || (v_call->>'tool'), 1)
                        ON CONFLICT (run_id, call_hash) DO UPDATE SET count = c.count + 1
                        RETURNING c.count INTO v_tool_count;
                    END IF;
                    IF v_call->>'tool_cap' IS NOT NULL AND v_tool_count > (v_call->>'tool_cap')::integer THEN
                        v_code := 'BUDGET_EXCEEDED';
                        v_content_key := 'TOOL_BUDGET_EXCEEDED';
                    ELSIF v_count > v_run.max_repeats THEN
                        v_code := 'REPEATED_CALL';
                    ELSIF (v_call->>'needs_approval')::boolean THEN
                        o_approval_id := v_call->>'approval_id';
                        INSERT INTO approvals (id, tenant_id, run_id, tool_call_id, requester_id, requester_roles,
                                               tool, canonical_arguments, arguments_sha256, status, created_at,
                                               expires_at)
                        VALUES (o_approval_id, v_tenant_id, v_run_id, v_id, v_user_id, v_batch->'roles',
                                v_call->>'tool', v_call->>'arguments', v_call->>'args_sha256', 'pending', p_now,
                                (v_batch->>'approval_expires_at')::timestamptz);
                        UPDATE tool_calls SET status = 'approval', approval_id = o_approval_id
                         WHERE run_id = v_run_id AND tool_call_id = v_id;
                        INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                                  arguments_sha256, outcome, approval_id, request_id, created_at)
                        VALUES (v_tenant_id, 'tool_call', v_user_id, v_run_id, v_id, v_call->>'tool',
                                v_call->'audit_args', v_call->>'args_sha256', 'APPROVAL_REQUIRED', o_approval_id,
                                v_request_id, p_now);
                        o_decision := 'decided';
                        o_outcome := 'APPROVAL_REQUIRED';
                        o_approval_status := 'pending';
                        RETURN NEXT;
                        CONTINUE;
                    ELSE
                        o_decision := 'execute';
                        o_outcome := NULL;
                        RETURN NEXT;
                        CONTINUE;
                    END IF;
                END IF;
                o_content := p_contents->>coalesce(v_content_key, v_code);
            ELSE
                o_content := v_call->>'content';
            END IF;

            UPDATE tool_calls SET status = 'done', outcome = v_code, content = o_content, finished_at = p_now
             WHERE run_id = v_run_id AND tool_call_id = v_id;
            INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                      arguments_sha256, outcome, request_id, created_at)
            VALUES (v_tenant_id, 'tool_call', v_user_id, v_run_id, v_id, v_call->>'tool', v_call->'audit_args',
                    v_call->>'args_sha256', v_code, v_request_id, p_now);
            o_decision := 'decided';
            o_outcome := v_code;
            RETURN NEXT;
        END LOOP;

        IF v_used <> v_run.used_tool_calls THEN
            UPDATE runs SET used_tool_calls = v_used WHERE id = v_run_id;
        END IF;
    END LOOP;
END;
$fn$;
"""

_approvals = sa.table(
    "approvals",
    sa.column("id", sa.String()),
    sa.column("arguments", JSON),
    sa.column("canonical_arguments", sa.Text()),
)


def upgrade() -> None:
    conn = op.get_bind()
    op.add_column("approvals", sa.Column("canonical_arguments", sa.Text(), nullable=True))
    rows = conn.execute(sa.select(_approvals.c.id, _approvals.c.arguments)).all()
    if rows:
        conn.execute(
            _approvals.update().where(_approvals.c.id == sa.bindparam("b_id")),
            [
                {"b_id": row.id, "canonical_arguments": msgspec.json.encode(row.arguments, order="sorted").decode()}
                for row in rows
            ],
        )
    with op.batch_alter_table("approvals") as batch:
        batch.alter_column("canonical_arguments", existing_type=sa.Text(), nullable=False)
        batch.drop_column("arguments")

    op.add_column("tool_calls", sa.Column("arguments_sha256", sa.String(64), nullable=True))
    op.execute(
        """
        UPDATE tool_calls SET arguments_sha256 = (
            SELECT a.arguments_sha256 FROM audit_events a
             WHERE a.tenant_id = tool_calls.tenant_id AND a.run_id = tool_calls.run_id
               AND a.tool_call_id = tool_calls.tool_call_id AND a.kind = 'tool_call'
             ORDER BY a.id LIMIT 1)
        """
    )
    if conn.dialect.name == "postgresql":
        op.execute(ADMIT_CALLS)


def _revision_0002() -> object:
    path = Path(__file__).with_name("0002_hot_path_functions.py")
    spec = importlib.util.spec_from_file_location("gateway_migration_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("DROP FUNCTION gateway_admit_calls(timestamptz, jsonb, jsonb, timestamptz)")
        op.execute(_revision_0002().ADMIT_CALLS)  # type: ignore[attr-defined]
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("arguments_sha256")

    op.add_column("approvals", sa.Column("arguments", JSON, nullable=True))
    rows = conn.execute(sa.select(_approvals.c.id, _approvals.c.canonical_arguments)).all()
    if rows:
        conn.execute(
            _approvals.update().where(_approvals.c.id == sa.bindparam("b_id")),
            [{"b_id": row.id, "arguments": msgspec.json.decode(row.canonical_arguments)} for row in rows],
        )
    with op.batch_alter_table("approvals") as batch:
        batch.alter_column("arguments", existing_type=JSON, nullable=False)
        batch.drop_column("canonical_arguments")
