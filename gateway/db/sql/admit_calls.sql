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
CREATE OR REPLACE FUNCTION gateway_admit_calls_one_by_one(p_batches jsonb, p_contents jsonb)
RETURNS TABLE (
    o_batch integer,
    o_tool_call_id text,
    o_decision text,
    o_outcome text,
    o_content text,
    o_approval_id text,
    o_approval_status text
)
LANGUAGE plpgsql
-- Every statement reads by key; a plan made while a table was small must not scan it later.
SET enable_seqscan = off
AS $fn$
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
    -- The caller sorts the batches by run id and tenant, so concurrent statements lock runs in
    -- one order.
    FOR v_batch IN SELECT value FROM jsonb_array_elements(p_batches) LOOP
        o_batch := o_batch + 1;
        v_batch_audit := v_batch->'audit';
        v_run_id := v_batch_audit->>'run_id';
        v_tenant_id := v_batch_audit->>'tenant_id';
        v_user_id := v_batch_audit->>'user_id';
        v_now := (v_batch_audit->>'created_at')::timestamptz;
        v_stale_before := (v_batch->>'stale_before')::timestamptz;

        -- Through the primary key (tenant_id, id); the user is a filter that no index can serve
        -- (see gateway_admit_common_calls).
        SELECT r.max_tool_calls, r.max_repeats, r.used_tool_calls, r.expires_at INTO v_run FROM runs r
         WHERE r.tenant_id = v_tenant_id AND r.id = v_run_id AND r.user_id IS NOT DISTINCT FROM v_user_id
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
            ON CONFLICT ON CONSTRAINT pk_tool_calls DO NOTHING;
            IF NOT FOUND THEN
                SELECT * INTO v_existing FROM tool_calls t
                 WHERE t.tenant_id = v_tenant_id AND t.run_id = v_run_id AND t.tool_call_id = v_id;
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
                          FROM approvals a
                         -- The call names the approval whichever key a kept plan reads it by.
                         WHERE a.tenant_id = v_tenant_id AND a.id = v_existing.approval_id
                           AND a.run_id = v_run_id AND a.tool_call_id = v_id;
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
                    INSERT INTO run_call_counts AS c (tenant_id, run_id, call_hash, count)
                    VALUES (v_tenant_id, v_run_id, v_call->>'call_hash', 1)
                    ON CONFLICT ON CONSTRAINT pk_run_call_counts DO UPDATE SET count = c.count + 1
                    RETURNING c.count INTO v_count;
                    v_tool_count := 0;
                    IF v_call->>'tool_cap' IS NOT NULL THEN
                        INSERT INTO run_call_counts AS c (tenant_id, run_id, call_hash, count)
                        VALUES (v_tenant_id, v_run_id, 'tool:' || v_tool, 1)
                        ON CONFLICT ON CONSTRAINT pk_run_call_counts DO UPDATE SET count = c.count + 1
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
                         WHERE tenant_id = v_tenant_id AND run_id = v_run_id AND tool_call_id = v_id;
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
             WHERE tenant_id = v_tenant_id AND run_id = v_run_id AND tool_call_id = v_id;
            o_decision := 'decided';
            o_outcome := v_code;
            v_audit := array_append(v_audit, v_call_audit || jsonb_build_object(
                'kind', 'tool_call', 'outcome', o_outcome));
            RETURN NEXT;
        END LOOP;

        IF v_used <> v_run.used_tool_calls THEN
            UPDATE runs SET used_tool_calls = v_used WHERE tenant_id = v_tenant_id AND id = v_run_id;
        END IF;
    END LOOP;
    IF cardinality(v_audit) > 0 THEN
        PERFORM gateway_append_audit(to_jsonb(v_audit));
    ELSIF NOT v_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$fn$;

-- gateway_admit_calls: the same answers, rows and audit rows as gateway_admit_calls_one_by_one,
-- with a few statements for the whole statement instead of several per call, in the common
-- case: every call of the statement is new (its id unknown to its run and not twice in the
-- statement), refused by no check, needs no approval and has no tool cap; every batch has calls;
-- every run is the caller's, not expired at the time of its batches and has budget for all its
-- calls. Then the loop would count every call, and refuse only those past the repeat limit: the
-- statement counts them in one upsert, claims and decides them in one INSERT (a call past the
-- limit stored refused, REPEATED_CALL), updates each run once and appends the audit rows in
-- one call, in the calls' order. Anything else (a replay, a conflict, a refusal, an approval, a
-- tool cap, a budget reached, an expired or unknown run) is decided call by call by
-- gateway_admit_calls_one_by_one, before anything is written. gateway_admit_calls unpacks its
-- JSON into arrays and, when the arrays show the common case, hands them to
-- gateway_admit_common_calls (below), which the gateway also calls directly.
--
-- Runs are locked in the order of the batches (the caller's, by run id and tenant), as the
-- loop locks them, and only then is tool_calls read: the rows of a run in tool_calls and
-- run_call_counts are written only under its lock, so what is read is what the loop would find.
-- Every table is read through its primary key, which leads with the tenant (migration 0020):
-- sequential scans, hash and merge joins are off (as in record_calls.sql), and plans are
-- generic, so that a plan made once fits every statement. A session keeps its plans: one made
-- while runs held a few rows (a new install) would otherwise scan runs at every statement of
-- that connection as the table grows.
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
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    -- Each call, in the statement's order.
    v_batch integer[];
    v_run text[];
    v_id text[];
    v_tool text[];
    v_args_sha256 text[];
    v_call_hash text[];
    v_now timestamptz[];
    v_result jsonb[];
    v_audit jsonb[];
    -- Each run, in the order of its first batch, and its owner.
    v_runs text[];
    v_run_tenant text[];
    v_run_user text[];
    v_read_only boolean;
    v_common boolean;
BEGIN
    WITH calls AS MATERIALIZED (
        SELECT b.n - 1 AS batch, b.value->'audit'->>'run_id' AS run, b.value->'audit'->>'tenant_id' AS tenant,
               b.value->'audit'->>'user_id' AS owner, (b.value->'audit'->>'created_at')::timestamptz AS now,
               c.audit->>'tool_call_id' AS id, c.audit->>'tool' AS tool, c.audit->>'arguments_sha256' AS args_sha256,
               c.call_hash, c.result, c.read_only, b.value->'audit' || c.audit AS audit,
               c.code IS NULL AND c.tool_cap IS NULL AND coalesce(c.needs_approval, 'false') = 'false'
               AND c.call_hash IS NOT NULL AS plain
          FROM jsonb_array_elements(p_batches) WITH ORDINALITY AS b(value, n)
         CROSS JOIN LATERAL jsonb_to_recordset(b.value->'calls')
               AS c(audit jsonb, code text, call_hash text, needs_approval text, tool_cap text, result jsonb,
                    read_only text)
    )
    SELECT c.batch, c.run, c.id, c.tool, c.args_sha256, c.call_hash, c.now, c.result, c.audit,
           c.read_only, c.common AND r.common AND c.batches = jsonb_array_length(p_batches),
           r.runs, r.tenants, r.owners
      INTO v_batch, v_run, v_id, v_tool, v_args_sha256, v_call_hash, v_now, v_result, v_audit,
           v_read_only, v_common,
           v_runs, v_run_tenant, v_run_user
      -- In the calls' order: the rows of calls are in it.
      FROM (SELECT array_agg(c.batch) AS batch, array_agg(c.run) AS run, array_agg(c.id) AS id,
                   array_agg(c.tool) AS tool, array_agg(c.args_sha256) AS args_sha256,
                   array_agg(c.call_hash) AS call_hash, array_agg(c.now) AS now, array_agg(c.result) AS result,
                   array_agg(c.audit) AS audit,
                   coalesce(bool_and(c.read_only IS NOT DISTINCT FROM 'true'), true) AS read_only,
                   coalesce(bool_and(c.plain AND c.id IS NOT NULL), false)
                   AND count(DISTINCT (c.run, c.id)) = count(*) AS common,
                   count(DISTINCT c.batch) AS batches
              FROM calls c) AS c,
           (SELECT array_agg(r.run) AS runs, array_agg(r.tenant) AS tenants, array_agg(r.owner) AS owners,
                   coalesce(bool_and(r.one_owner AND r.run IS NOT NULL), false) AS common
              FROM (SELECT c.run, min(c.tenant) AS tenant, min(c.owner) AS owner,
                           -- min and max skip NULLs: a batch naming no tenant or user is no owner
                           count(c.tenant) = count(*) AND count(c.owner) = count(*)
                           AND min(c.tenant) = max(c.tenant) AND min(c.owner) = max(c.owner) AS one_owner
                      FROM calls c GROUP BY c.run ORDER BY min(c.batch)) AS r) AS r;

    IF v_common THEN
        RETURN QUERY SELECT * FROM gateway_admit_common_calls(
            v_batch, v_run, v_id, v_tool, v_args_sha256, v_call_hash, v_now, v_result, v_audit, v_read_only,
            v_runs, v_run_tenant, v_run_user, NULL, p_contents, p_batches);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM gateway_admit_calls_one_by_one(p_batches, p_contents);
END;
$fn$;

-- gateway_admit_common_calls: the common case of gateway_admit_calls (above), its calls given
-- as arrays, one element per call in the statement's order, and its runs (in the order of
-- their first batch) with their owners, as gateway_admit_calls unpacks them from its JSON. The
-- gateway, which knows the batches, sends them so when it sees the common case, and PostgreSQL
-- neither parses the JSON nor starts the thirty-odd aggregates that unpack it (measured on one
-- connection: an admission of one call cost 0.56-0.80x the server CPU it cost as JSON, of four
-- 0.79-0.88x, of sixteen 0.79-0.92x). The gateway has checked what the batches alone show: every
-- call plain (no refusal code, no approval, no tool cap, a call hash), no (run, id) twice, every
-- batch with calls, one owner per run. What only the database knows (the runs' owners, expiry
-- and budget under their locks, the ids already seen) is checked here, and that every call is
-- of one of the runs; when it does not hold, nothing has been written and the calls are decided
-- one by one (gateway_admit_calls_one_by_one), in the same statement, from p_batches: the same
-- batches as JSON text, parsed only then (or from p_batches_jsonb, when gateway_admit_calls
-- passes on the JSON it was given). An audit row's tenant, user, run and call id are those
-- checked here, whatever its part of v_audit says.
-- v_result: a pure call's outcome ({"outcome", "content", "duration_ms", "error_id"}) or NULL;
-- v_audit: the call's audit row part merged with its batch's (tenant_id, user_id, run_id,
-- request_id, created_at, tool_call_id, tool, arguments, arguments_sha256).
CREATE OR REPLACE FUNCTION gateway_admit_common_calls(
    v_batch integer[], v_run text[], v_id text[], v_tool text[], v_args_sha256 text[], v_call_hash text[],
    v_now timestamptz[], v_result jsonb[], v_audit jsonb[], v_read_only boolean,
    v_runs text[], v_run_tenant text[], v_run_user text[], p_batches text, p_contents jsonb,
    p_batches_jsonb jsonb)
RETURNS TABLE (
    o_batch integer,
    o_tool_call_id text,
    o_decision text,
    o_outcome text,
    o_content text,
    o_approval_id text,
    o_approval_status text
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    v_common boolean := true;
    v_run_calls integer[];
    v_run_max_repeats integer[];
    v_repeated boolean[];
    v_audit_rows jsonb;
BEGIN
    IF v_common THEN
        -- Lock every run, in the batches' order; each must be the caller's, not expired at the
        -- latest time of its batches (nor then at an earlier one), with budget for all its calls.
        -- A run's calls and latest time are counted from the calls, and every call must be of a
        -- run locked here: the runs are distinct and their calls add up to the calls (the arrays
        -- come from the gateway, and a call of a run not locked here would escape its owner's
        -- and its budget's checks); a call without a time fails the check, never skips it.
        SELECT count(*) = cardinality(v_runs) AND count(DISTINCT l.id) = count(*)
               AND coalesce(sum(l.calls), 0) = cardinality(v_run)
               AND coalesce(bool_and(coalesce(l.timed = l.calls
                                              AND (l.expires_at IS NULL OR l.expires_at > l.last_now)
                                              AND l.used_tool_calls + l.calls <= l.max_tool_calls, false)), false),
               array_agg(l.max_repeats ORDER BY l.i), array_agg(l.calls ORDER BY l.i)
          INTO v_common, v_run_max_repeats, v_run_calls
          FROM (SELECT w.i::integer AS i, w.id, g.calls, g.timed, g.last_now,
                       r.max_tool_calls, r.max_repeats, r.used_tool_calls, r.expires_at
                  FROM unnest(v_runs, v_run_tenant, v_run_user) WITH ORDINALITY AS w(id, tenant, owner, i)
                  JOIN (SELECT c.run, count(*)::integer AS calls, count(c.now)::integer AS timed, max(c.now) AS last_now
                          FROM unnest(v_run, v_now) AS c(run, now) GROUP BY c.run) AS g ON g.run = w.id
                  -- Through the primary key (tenant_id, id); the user as IS NOT DISTINCT FROM,
                  -- which no index serves: with plain equalities a generic plan made while runs
                  -- was small and not analyzed could read the runs through (tenant_id, user_id,
                  -- created_at): at each lookup, the user's runs in order of creation up to the
                  -- one it wants. (Both sides are never NULL: runs' columns are NOT NULL, and a
                  -- batch naming no owner is not common.)
                  JOIN runs r ON r.tenant_id = w.tenant AND r.id = w.id AND r.user_id IS NOT DISTINCT FROM w.owner
                 ORDER BY w.i
                   FOR UPDATE OF r) AS l;
    END IF;

    IF v_common THEN
        -- Under the locks: no id is known to its run.
        -- (Every call is of a run locked above, so its tenant is that run's.)
        SELECT NOT coalesce(bool_or(EXISTS (SELECT FROM tool_calls t
                                             WHERE t.tenant_id = v_run_tenant[array_position(v_runs, c.run)]
                                               AND t.run_id = c.run AND t.tool_call_id = c.id)), false)
          INTO v_common
          FROM unnest(v_run, v_id) AS c(run, id);
    END IF;

    IF NOT v_common THEN  -- nothing written yet: decided call by call, from the batches' JSON
        RETURN QUERY SELECT * FROM gateway_admit_calls_one_by_one(coalesce(p_batches_jsonb, p_batches::jsonb),
                                                                  p_contents);
        RETURN;
    END IF;

    -- Every call is counted, as the loop counts it; its count is its run's count of its hash
    -- before the statement plus its place among the statement's calls of that hash, and past
    -- the run's repeat limit it is refused. The count before is read by key: every part of a
    -- statement sees the rows as they were when it began, and no other transaction writes a
    -- run's counts while this one holds the run's lock (taken above). (Joining the calls to
    -- the upsert's RETURNING instead joined two sets without an index, hash and merge joins
    -- being off: a nested loop, its cost growing with the square of the statement's calls.)
    WITH counted AS (
        INSERT INTO run_call_counts AS rc (tenant_id, run_id, call_hash, count)
        SELECT v_run_tenant[array_position(v_runs, c.run)], c.run, c.call_hash, count(*)
          FROM unnest(v_run, v_call_hash) AS c(run, call_hash)
         GROUP BY c.run, c.call_hash
            ON CONFLICT ON CONSTRAINT pk_run_call_counts DO UPDATE SET count = rc.count + excluded.count
    ), decided AS MATERIALIZED (
        SELECT c.ord::integer AS ord, c.run_index,
               coalesce((SELECT k.count FROM run_call_counts k
                          WHERE k.tenant_id = v_run_tenant[c.run_index] AND k.run_id = c.run
                            AND k.call_hash = c.call_hash), 0)
               + row_number() OVER (PARTITION BY c.run, c.call_hash ORDER BY c.ord)
                   > v_run_max_repeats[c.run_index] AS repeated
          FROM (SELECT u.*, array_position(v_runs, u.run) AS run_index
                  FROM unnest(v_run, v_call_hash) WITH ORDINALITY AS u(run, call_hash, ord)) AS c
         ORDER BY c.ord
    ), claimed AS (
        INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, arguments_sha256, status, created_at,
                                outcome, content, finished_at)
        SELECT v_run[d.ord], v_id[d.ord], v_run_tenant[d.run_index], v_tool[d.ord], v_args_sha256[d.ord],
               CASE WHEN d.repeated OR v_result[d.ord] IS NOT NULL THEN 'done' ELSE 'executing' END, v_now[d.ord],
               CASE WHEN d.repeated THEN 'REPEATED_CALL' ELSE v_result[d.ord]->>'outcome' END,
               CASE WHEN d.repeated THEN p_contents->>'REPEATED_CALL' ELSE v_result[d.ord]->>'content' END,
               CASE WHEN d.repeated OR v_result[d.ord] IS NOT NULL THEN v_now[d.ord] END
          FROM decided d
    ), used AS (
        UPDATE runs r SET used_tool_calls = r.used_tool_calls + w.calls
          FROM unnest(v_runs, v_run_tenant, v_run_calls) AS w(id, tenant, calls)
         WHERE r.tenant_id = w.tenant AND r.id = w.id
    )
    SELECT array_agg(d.repeated),
           jsonb_agg(v_audit[d.ord]
                     -- who and which call as checked under the lock, not as the arrays say
                     || jsonb_build_object('tenant_id', v_run_tenant[d.run_index], 'user_id', v_run_user[d.run_index],
                                           'run_id', v_run[d.ord], 'tool_call_id', v_id[d.ord])
                     || CASE WHEN d.repeated
                                     THEN jsonb_build_object('kind', 'tool_call', 'outcome', 'REPEATED_CALL')
                                     ELSE jsonb_build_object('kind', 'tool_call',
                                                             'outcome', v_result[d.ord]->>'outcome',
                                                             'duration_ms', v_result[d.ord]->'duration_ms',
                                                             'error_id', v_result[d.ord]->'error_id')
                                END) FILTER (WHERE d.repeated OR v_result[d.ord] IS NOT NULL)
      INTO v_repeated, v_audit_rows
      -- decided is in the calls' order
      FROM decided d;

    RETURN QUERY
        SELECT c.batch, c.id,
               CASE WHEN c.repeated THEN 'decided' WHEN c.result IS NULL THEN 'execute' ELSE 'executed' END,
               CASE WHEN c.repeated THEN 'REPEATED_CALL' ELSE c.result->>'outcome' END,
               CASE WHEN c.repeated THEN p_contents->>'REPEATED_CALL' END, NULL::text, NULL::text
          FROM unnest(v_batch, v_id, v_result, v_repeated) AS c(batch, id, result, repeated);

    IF v_audit_rows IS NOT NULL THEN
        PERFORM gateway_append_audit(v_audit_rows);
    ELSIF v_read_only THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$fn$;
