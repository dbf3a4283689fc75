"""PostgreSQL: admit a batch of tool calls in one round trip.

``gateway_admit_calls`` does, under the run's row lock and in one statement: find the run
(tenant and user scoped), answer replays of known tool_call_ids from what is stored, and for
each new call store the pre-decided outcome, or count it against the budget and the repeat
limit, create its approval, or mark it executing; every outcome decided here gets its audit
row in the same transaction. The logic mirrors ``gateway.execution.ledger.SqliteLedger``;
the ledger tests run the same cases against both.

On SQLite this revision does nothing: SQLite runs the Python implementation.

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
CREATE FUNCTION gateway_admit_calls(
    p_run_id text,
    p_tenant_id text,
    p_user_id text,
    p_roles jsonb,
    p_request_id text,
    p_now timestamptz,
    p_approval_expires_at timestamptz,
    p_calls jsonb,
    p_contents jsonb
) RETURNS TABLE (
    o_tool_call_id text,
    o_decision text,
    o_outcome text,
    o_content text,
    o_approval_id text,
    o_approval_status text
)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_run runs%ROWTYPE;
    v_call jsonb;
    v_id text;
    v_code text;
    v_count integer;
    v_used integer;
    v_existing tool_calls%ROWTYPE;
    v_approval_status text;
    v_approval_expires timestamptz;
BEGIN
    SELECT * INTO v_run FROM runs r
     WHERE r.id = p_run_id AND r.tenant_id = p_tenant_id AND r.user_id = p_user_id
       FOR UPDATE;
    IF NOT FOUND THEN
        o_decision := 'no_run';
        RETURN NEXT;
        RETURN;
    END IF;
    v_used := v_run.used_tool_calls;

    FOR v_call IN SELECT value FROM jsonb_array_elements(p_calls) LOOP
        v_id := v_call->>'id';
        o_tool_call_id := v_id;
        o_content := NULL;
        o_approval_id := NULL;
        o_approval_status := NULL;

        SELECT * INTO v_existing FROM tool_calls t WHERE t.run_id = p_run_id AND t.tool_call_id = v_id;
        IF FOUND THEN
            o_decision := 'replay';
            o_content := v_existing.content;
            o_approval_id := v_existing.approval_id;
            o_outcome := v_existing.outcome;
            IF v_existing.outcome IS NULL THEN
                IF v_existing.approval_id IS NOT NULL THEN
                    SELECT a.status, a.expires_at INTO v_approval_status, v_approval_expires
                      FROM approvals a WHERE a.id = v_existing.approval_id;
                    o_approval_status := v_approval_status;
                    o_outcome := CASE
                        WHEN v_approval_status = 'pending' AND v_approval_expires > p_now THEN 'APPROVAL_REQUIRED'
                        WHEN v_approval_status IN ('pending', 'expired') THEN 'APPROVAL_EXPIRED'
                        WHEN v_approval_status = 'rejected' THEN 'APPROVAL_REJECTED'
                        ELSE 'TOOL_CALL_IN_PROGRESS'
                    END;
                ELSE
                    o_outcome := 'TOOL_CALL_IN_PROGRESS';
                END IF;
            END IF;
            INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                      arguments_sha256, outcome, approval_id, request_id, detail, created_at)
            VALUES (p_tenant_id, 'tool_call_replay', p_user_id, p_run_id, v_id, v_call->>'tool', v_call->'audit_args',
                    v_call->>'args_sha256', o_outcome, o_approval_id, p_request_id, NULL, p_now);
            RETURN NEXT;
            CONTINUE;
        END IF;

        v_code := v_call->>'code';
        IF v_code IS NULL THEN
            IF v_run.expires_at IS NOT NULL AND v_run.expires_at <= p_now THEN
                v_code := 'RUN_EXPIRED';
            ELSIF v_used >= v_run.max_tool_calls THEN
                v_code := 'BUDGET_EXCEEDED';
            ELSE
                v_used := v_used + 1;
                INSERT INTO run_call_counts AS c (run_id, call_hash, count)
                VALUES (p_run_id, v_call->>'call_hash', 1)
                ON CONFLICT (run_id, call_hash) DO UPDATE SET count = c.count + 1
                RETURNING c.count INTO v_count;
                IF v_count > v_run.max_repeats THEN
                    v_code := 'REPEATED_CALL';
                ELSIF (v_call->>'needs_approval')::boolean THEN
                    o_approval_id := v_call->>'approval_id';
                    INSERT INTO approvals (id, tenant_id, run_id, tool_call_id, requester_id, requester_roles, tool,
                                           arguments, arguments_sha256, status, created_at, expires_at)
                    VALUES (o_approval_id, p_tenant_id, p_run_id, v_id, p_user_id, p_roles, v_call->>'tool',
                            v_call->'arguments', v_call->>'args_sha256', 'pending', p_now, p_approval_expires_at);
                    INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, status, approval_id, created_at)
                    VALUES (p_run_id, v_id, p_tenant_id, v_call->>'tool', 'approval', o_approval_id, p_now);
                    INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                              arguments_sha256, outcome, approval_id, request_id, created_at)
                    VALUES (p_tenant_id, 'tool_call', p_user_id, p_run_id, v_id, v_call->>'tool', v_call->'audit_args',
                            v_call->>'args_sha256', 'APPROVAL_REQUIRED', o_approval_id, p_request_id, p_now);
                    o_decision := 'decided';
                    o_outcome := 'APPROVAL_REQUIRED';
                    o_approval_status := 'pending';
                    RETURN NEXT;
                    CONTINUE;
                ELSE
                    INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, status, created_at)
                    VALUES (p_run_id, v_id, p_tenant_id, v_call->>'tool', 'executing', p_now);
                    o_decision := 'execute';
                    o_outcome := NULL;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
            o_content := p_contents->>v_code;
        ELSE
            o_content := v_call->>'content';
        END IF;

        INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, status, outcome, content, created_at, finished_at)
        VALUES (p_run_id, v_id, p_tenant_id, v_call->>'tool', 'done', v_code, o_content, p_now, p_now);
        INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments,
                                  arguments_sha256, outcome, request_id, detail, created_at)
        VALUES (p_tenant_id, 'tool_call', p_user_id, p_run_id, v_id, v_call->>'tool', v_call->'audit_args',
                v_call->>'args_sha256', v_code, p_request_id, v_call->'detail', p_now);
        o_decision := 'decided';
        o_outcome := v_code;
        RETURN NEXT;
    END LOOP;

    IF v_used <> v_run.used_tool_calls THEN
        UPDATE runs SET used_tool_calls = v_used WHERE id = p_run_id;
    END IF;
END;
$fn$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(ADMIT_CALLS)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "DROP FUNCTION gateway_admit_calls(text, text, text, jsonb, text, timestamptz, timestamptz, jsonb, jsonb)"
    )
