-- Store the outcomes of executed calls (answered to replays) and their audit rows together.
-- p_rows: [{"content": ..., "audit": <AuditRow>}]; the audit row names the call (tenant_id,
-- run_id, tool_call_id), its outcome and the time it finished (created_at).
-- PL/pgSQL so that a session keeps the statement's plan (see append_audit.sql).
CREATE OR REPLACE FUNCTION gateway_record_calls(p_rows jsonb) RETURNS void
LANGUAGE plpgsql
-- The JSON rows are few: join them to tool_calls through its primary key, never by scanning
-- or hashing the table (a session keeps its plan: one made while the table was small would
-- otherwise scan it at every statement as the table grows).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $fn$
BEGIN
    WITH rows AS (
        SELECT r.audit->>'tenant_id' AS tenant_id, r.audit->>'run_id' AS run_id,
               r.audit->>'tool_call_id' AS tool_call_id,
               r.audit->>'outcome' AS outcome, r.content, (r.audit->>'created_at')::timestamptz AS finished_at
          FROM jsonb_to_recordset(p_rows) AS r(content text, audit jsonb)
    )
    UPDATE tool_calls t
       SET status = 'done', outcome = r.outcome, content = r.content, finished_at = r.finished_at
      FROM rows r
     WHERE t.tenant_id = r.tenant_id AND t.run_id = r.run_id AND t.tool_call_id = r.tool_call_id;
    PERFORM gateway_append_audit(jsonb_agg(e.value->'audit')) FROM jsonb_array_elements(p_rows) AS e;
END;
$fn$;
