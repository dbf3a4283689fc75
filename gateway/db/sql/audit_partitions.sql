-- audit_events is partitioned by month of created_at (UTC), with a DEFAULT partition that
-- catches any row no month exists for yet, so that an insert never fails for want of a
-- partition (migration 0013).
--
-- gateway_audit_add_partition(month): the partition audit_events_pYYYY_MM of the UTC month
-- starting at `month` (a timestamp without time zone, read as UTC). It is made as a table of
-- its own and then attached: ATTACH PARTITION takes only a SHARE UPDATE EXCLUSIVE lock on
-- audit_events, so inserts go on meanwhile (CREATE TABLE ... PARTITION OF would take an
-- ACCESS EXCLUSIVE one). Rows of that month already in the default partition move into the
-- new table first (the default partition's delete guard is off for that one statement, in
-- this transaction); attaching then checks the default holds none of the month.
--
-- gateway_audit_ensure_partitions(months_ahead): every month that has rows in the default
-- partition, and the current month and `months_ahead` after it, get their partition; the
-- number made. The sealer calls it in its turn (gateway/audit/sealer.py), the prune before
-- it drops months, the migration once.
CREATE OR REPLACE FUNCTION gateway_audit_add_partition(p_month timestamp) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_month timestamp := date_trunc('month', p_month);
    v_name text := 'audit_events_p' || to_char(date_trunc('month', p_month), 'YYYY_MM');
    v_from timestamptz := date_trunc('month', p_month) AT TIME ZONE 'UTC';
    v_to timestamptz := (date_trunc('month', p_month) + interval '1 month') AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE audit_events INCLUDING DEFAULTS)', v_name);
    IF EXISTS (SELECT 1 FROM audit_events_default WHERE created_at >= v_from AND created_at < v_to) THEN
        ALTER TABLE audit_events_default DISABLE TRIGGER audit_events_insert_only_delete;
        EXECUTE format(
            'WITH moved AS (DELETE FROM audit_events_default WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
            'INSERT INTO %I SELECT * FROM moved', v_name
        ) USING v_from, v_to;
        ALTER TABLE audit_events_default ENABLE TRIGGER audit_events_insert_only_delete;
    END IF;
    EXECUTE format(
        'ALTER TABLE audit_events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
        v_name, to_char(v_from AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00'),
        to_char(v_to AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00')
    );
END;
$fn$;

CREATE OR REPLACE FUNCTION gateway_audit_ensure_partitions(p_months_ahead integer) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamp := date_trunc('month', now() AT TIME ZONE 'UTC');
    v_months timestamp[];
    v_month timestamp;
    v_made integer := 0;
BEGIN
    -- Read into an array first: the default partition cannot be altered while a loop's
    -- query still reads it.
    SELECT array_agg(m ORDER BY m) INTO v_months FROM (
        SELECT m FROM generate_series(v_now, v_now + make_interval(months => p_months_ahead), interval '1 month') AS m
        UNION
        SELECT DISTINCT date_trunc('month', d.created_at AT TIME ZONE 'UTC') FROM audit_events_default d
    ) AS months;
    FOREACH v_month IN ARRAY v_months
    LOOP
        IF to_regclass('audit_events_p' || to_char(v_month, 'YYYY_MM')) IS NULL THEN
            PERFORM gateway_audit_add_partition(v_month);
            v_made := v_made + 1;
        END IF;
    END LOOP;
    RETURN v_made;
END;
$fn$;
