-- The shared token buckets: for each (tenant, user) bucket, refill by the time passed, then
-- take up to what is asked. A tenant's override replaces the configured rate and burst.
-- p_now: the caller's clock; NULL takes the database's.
CREATE OR REPLACE FUNCTION gateway_take_tokens(
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
