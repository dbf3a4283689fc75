"""Admit and record batches of tool calls in one round trip each.

``gateway_admit_calls`` takes the batches of several concurrent requests (each: one run
and its calls) and does for each, under the run's row lock and in one statement: find the
run (tenant and user scoped); answer replays of known tool_call_ids from what is stored
(a call still executing is "in progress", unless it started before ``p_stale_before`` —
longer ago than any call can run — when its process stopped while it ran and its outcome
is unknown); and for each new call store the pre-decided outcome, or count it against the
budget, the tool's own cap (counted under the key 'tool:<name>') and the repeat limit,
create its approval, or mark it executing. Every outcome decided here gets its audit row
in the same transaction.

``gateway_record_calls`` stores the outcomes of executed calls (answered to replays) and
their audit rows together.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADMIT_CALLS = r"""
CREATE FUNCTION gateway_admit_calls(p_now timestamptz, p_batches jsonb, p_contents jsonb,
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
            INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, status, created_at)
            VALUES (v_run_id, v_id, v_tenant_id, v_call->>'tool', 'executing', p_now)
            ON CONFLICT (run_id, tool_call_id) DO NOTHING;
            IF NOT FOUND THEN
                SELECT * INTO v_existing FROM tool_calls t WHERE t.run_id = v_run_id AND t.tool_call_id = v_id;
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
                                               tool, arguments, arguments_sha256, status, created_at, expires_at)
                        VALUES (o_approval_id, v_tenant_id, v_run_id, v_id, v_user_id, v_batch->'roles',
                                v_call->>'tool', v_call->'arguments', v_call->>'args_sha256', 'pending', p_now,
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


RECORD_CALLS = r"""
CREATE FUNCTION gateway_record_calls(p_now timestamptz, p_rows jsonb) RETURNS void
LANGUAGE sql
-- The JSON rows are few: join them to tool_calls through its primary key, never by hashing
-- the table (a plan made while the table was small would otherwise scan it later).
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $fn$
    WITH rows AS (
        SELECT * FROM jsonb_to_recordset(p_rows) AS r(
            run_id text, tenant_id text, user_id text, request_id text, tool_call_id text, tool text,
            outcome text, content text, duration_ms float8, error_id text, audit_args jsonb, args_sha256 text)
    ), stored AS (
        UPDATE tool_calls t
           SET status = 'done', outcome = r.outcome, content = r.content, finished_at = p_now
          FROM rows r
         WHERE t.run_id = r.run_id AND t.tool_call_id = r.tool_call_id
    )
    INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments, arguments_sha256,
                              outcome, duration_ms, request_id, error_id, created_at)
    SELECT r.tenant_id, 'tool_call', r.user_id, r.run_id, r.tool_call_id, r.tool, r.audit_args, r.args_sha256,
           r.outcome, r.duration_ms, r.request_id, r.error_id, p_now
      FROM rows r;
$fn$;
"""


def upgrade() -> None:
    op.execute(ADMIT_CALLS)
    op.execute(RECORD_CALLS)


def downgrade() -> None:
    op.execute("DROP FUNCTION gateway_record_calls(timestamptz, jsonb)")
    op.execute("DROP FUNCTION gateway_admit_calls(timestamptz, jsonb, jsonb, timestamptz)")
