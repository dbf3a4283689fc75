-- The hot path's one writer of audit rows: p_rows is a JSON array of objects keyed by the
-- fields of gateway.audit.rows.AuditRow (a test keeps this column list equal to them).
-- The chain's columns stay NULL: the sealer fills them.
-- PL/pgSQL, not SQL: a session plans the statement once and keeps the plan (a SQL function
-- called from another function is parsed and planned again at every call).
CREATE OR REPLACE FUNCTION gateway_append_audit(p_rows jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO audit_events (tenant_id, kind, outcome, created_at, user_id, run_id, tool_call_id, tool, arguments,
                              arguments_sha256, duration_ms, approval_id, request_id, error_id, detail)
    SELECT r.tenant_id, r.kind, r.outcome, r.created_at, r.user_id, r.run_id, r.tool_call_id, r.tool, r.arguments,
           r.arguments_sha256, r.duration_ms, r.approval_id, r.request_id, r.error_id, r.detail
      FROM jsonb_populate_recordset(NULL::audit_events, coalesce(p_rows, '[]'::jsonb)) AS r;
END;
$fn$;
