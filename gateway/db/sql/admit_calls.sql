-- Admit the tool calls of several concurrent requests in one statement. Each batch is one
-- run and its calls; for each, under the run's row lock: find the run (tenant and user
-- scoped); answer a tool_call_id the run has seen from what is stored when it names the
-- stored call (same tool, same arguments hash), and TOOL_CALL_ID_CONFLICT when it does not;
-- store the outcome of calls the checks rejected; count every other call against the
-- budget, the tool's own cap (counted under 'tool:<name>') and the repeat limit; create the
-- approval of a call that needs one; mark the rest executing. Every outcome decided here is
-- audited in the same transaction.
--
-- A call of a pure tool (no I/O, no effects) may come with its outcome already computed
-- ("result"): when it is admitted, that outcome is stored and audited here, so the call
-- needs no second statement (decision 'executed'); when it is not, the result is dropped
-- and the call is answered as any other.
--
-- p_batches: [{"audit": <AuditRow part: tenant_id, user_id, run_id, request_id, created_at>,
--              "roles": [...], "stale_before": ts, "approval_expires_at": ts,
--              "calls": [{"audit": <AuditRow part: tool_call_id, tool, arguments, arguments_sha256>,
--                         "code", "content", "call_hash", "needs_approval", "approval_id",
--                         "arguments", "tool_cap",
--                         "result": {"outcome", "content", "duration_ms", "error_id"} (optional)}]}]
-- A call that will run a tool changing nothing ("read_only": true) and is admitted to run has
-- no answer yet: its outcome comes from the recording statement, which commits durably
-- (synchronous_commit on) and, WAL being written in order, makes this claim durable with it.
-- So a statement whose every call is such a claim, and that writes no audit row, commits
-- without waiting for its WAL flush: a crash before the record loses the claim of a call
-- nobody was answered for, whose tool changed nothing. Any other outcome is answered from
-- this statement (or changes data) and commits durably.
-- The batch's created_at is the caller's clock: every time rule here (run expiry, approval
-- expiry, stale calls) is decided at it, never at the database's clock.
-- p_contents: the message content of each code the ledger decides.
CREATE OR REPLACE FUNCTION gateway_admit_calls(p_batches jsonb, p_contents jsonb)
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
    v_batch_audit jsonb;
    v_run record;
    v_run_id text;
    v_tenant_id text;
    v_user_id text;
    v_now timestamptz;
    v_stale_before timestamptz;
    v_call jsonb;
    v_call_audit jsonb;
    v_id text;
    v_tool text;
    v_args_sha256 text;
    v_code text;
    v_count integer;
    v_tool_count integer;
    v_content_key text;
    v_used integer;
    v_existing tool_calls%ROWTYPE;
    v_approval_status text;
    v_approval_expires timestamptz;
    v_approval_decided timestamptz;
    v_result jsonb;
    -- An array grows in place; a JSON array would be copied whole at every append.
    v_audit jsonb[] := '{}';
    v_durable boolean := false;
BEGIN
    o_batch := -1;
    -- The caller sorts the batches by run id, so concurrent statements lock runs in one order.
    FOR v_batch IN SELECT value FROM jsonb_array_elements(p_batches) LOOP
        o_batch := o_batch + 1;
        v_batch_audit := v_batch->'audit';
        v_run_id := v_batch_audit->>'run_id';
        v_tenant_id := v_batch_audit->>'tenant_id';
        v_user_id := v_batch_audit->>'user_id';
        v_now := (v_batch_audit->>'created_at')::timestamptz;
        v_stale_before := (v_batch->>'stale_before')::timestamptz;

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
            v_call_audit := v_batch_audit || (v_call->'audit');
            v_id := v_call_audit->>'tool_call_id';
            v_tool := v_call_audit->>'tool';
            v_args_sha256 := v_call_audit->>'arguments_sha256';
            o_tool_call_id := v_id;
            o_content := NULL;
            o_approval_id := NULL;
            o_approval_status := NULL;

            v_result := v_call->'result';
            -- Claim the id first (the common case: a new call that will run, or that ran ahead
            -- and is stored done at once); an id the run has seen is not claimed again and is
            -- answered from what is stored. A refusal below overwrites the stored outcome.
            INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, arguments_sha256, status, created_at,
                                    outcome, content, finished_at)
            VALUES (v_run_id, v_id, v_tenant_id, v_tool, v_args_sha256,
                    CASE WHEN v_result IS NULL THEN 'executing' ELSE 'done' END, v_now,
                    v_result->>'outcome', v_result->>'content', CASE WHEN v_result IS NOT NULL THEN v_now END)
            ON CONFLICT (run_id, tool_call_id) DO NOTHING;
            IF NOT FOUND THEN
                SELECT * INTO v_existing FROM tool_calls t WHERE t.run_id = v_run_id AND t.tool_call_id = v_id;
                IF v_existing.tool IS DISTINCT FROM v_tool
                   OR v_existing.arguments_sha256 IS DISTINCT FROM v_args_sha256 THEN
                    -- The id names another call: never answer it with that call's outcome, and run nothing.
                    o_decision := 'decided';
                    o_outcome := 'TOOL_CALL_ID_CONFLICT';
                    o_content := p_contents->>'TOOL_CALL_ID_CONFLICT';
                    v_audit := array_append(v_audit, v_call_audit || jsonb_build_object(
                        'kind', 'tool_call_conflict', 'outcome', o_outcome,
                        'detail', jsonb_build_object('stored_tool', v_existing.tool,
                                                     'stored_arguments_sha256', v_existing.arguments_sha256)));
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
                            WHEN v_approval_status = 'pending' AND v_approval_expires > v_now THEN 'APPROVAL_REQUIRED'
                            WHEN v_approval_status IN ('pending', 'expired') THEN 'APPROVAL_EXPIRED'
                            WHEN v_approval_status = 'rejected' THEN 'APPROVAL_REJECTED'
                            WHEN v_approval_decided < v_stale_before THEN 'TOOL_OUTCOME_UNKNOWN'
                            ELSE 'TOOL_CALL_IN_PROGRESS'
                        END;
                    ELSIF v_existing.created_at < v_stale_before THEN
                        -- Started long ago and never recorded: its process stopped while it ran.
                        o_outcome := 'TOOL_OUTCOME_UNKNOWN';
                    ELSE
                        o_outcome := 'TOOL_CALL_IN_PROGRESS';
                    END IF;
                END IF;
                v_audit := array_append(v_audit, v_call_audit || jsonb_build_object(
                    'kind', 'tool_call_replay', 'outcome', o_outcome, 'approval_id', o_approval_id));
                RETURN NEXT;
                CONTINUE;
            END IF;

            v_code := v_call->>'code';
            v_content_key := NULL;
            IF v_code IS NULL THEN
                IF v_run.expires_at IS NOT NULL AND v_run.expires_at <= v_now THEN
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
                        VALUES (v_run_id, 'tool:' || v_tool, 1)
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
                                v_tool, v_call->>'arguments', v_args_sha256, 'pending', v_now,
                                (v_batch->>'approval_expires_at')::timestamptz);
                        -- Clears an outcome that came with the call: a call waiting for approval has none.
                        UPDATE tool_calls SET status = 'approval', approval_id = o_approval_id, outcome = NULL,
                                              content = NULL, finished_at = NULL
                         WHERE run_id = v_run_id AND tool_call_id = v_id;
                        o_decision := 'decided';
                        o_outcome := 'APPROVAL_REQUIRED';
                        o_approval_status := 'pending';
                        v_audit := array_append(v_audit, v_call_audit || jsonb_build_object(
                            'kind', 'tool_call', 'outcome', o_outcome, 'approval_id', o_approval_id));
                        RETURN NEXT;
                        CONTINUE;
                    ELSIF v_result IS NOT NULL THEN
                        -- Ran ahead: its outcome is stored (by the claim above) and audited now.
                        o_decision := 'executed';
                        o_outcome := v_result->>'outcome';
                        v_audit := array_append(v_audit, v_call_audit || jsonb_build_object(
                            'kind', 'tool_call', 'outcome', o_outcome, 'duration_ms', v_result->'duration_ms',
                            'error_id', v_result->'error_id'));
                        RETURN NEXT;
                        CONTINUE;
                    ELSE
                        o_decision := 'execute';
                        o_outcome := NULL;
                        IF (v_call->>'read_only') IS DISTINCT FROM 'true' THEN
                            v_durable := true;
                        END IF;
                        RETURN NEXT;
                        CONTINUE;
                    END IF;
                END IF;
                o_content := p_contents->>coalesce(v_content_key, v_code);
            ELSE
                o_content := v_call->>'content';
            END IF;

            UPDATE tool_calls SET status = 'done', outcome = v_code, content = o_content, finished_at = v_now
             WHERE run_id = v_run_id AND tool_call_id = v_id;
            o_decision := 'decided';
            o_outcome := v_code;
            v_audit := array_append(v_audit, v_call_audit || jsonb_build_object(
                'kind', 'tool_call', 'outcome', o_outcome));
            RETURN NEXT;
        END LOOP;

        IF v_used <> v_run.used_tool_calls THEN
            UPDATE runs SET used_tool_calls = v_used WHERE id = v_run_id;
        END IF;
    END LOOP;
    IF cardinality(v_audit) > 0 THEN
        PERFORM gateway_append_audit(to_jsonb(v_audit));
    ELSIF NOT v_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$fn$;
