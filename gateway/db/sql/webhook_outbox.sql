-- The webhook outbox: a change that a tenant's webhooks announce writes its delivery rows in
-- its own transaction, so an event is sent if and only if its change committed.
--
-- Triggers on approvals (created, decided, expired) and on runs (an agent run that stopped
-- or failed) write one row in webhook_deliveries per subscription of the tenant that asked
-- for the event; the row's id is the `webhook-id` of every attempt. A tenant without such a
-- subscription pays one indexed EXISTS (webhook_subscriptions by tenant_id), and the hot
-- path's updates of runs never fire the trigger (it watches loop_state, which they leave
-- alone). The event's data is built here, from the row: ids, tool, states and times, never
-- the call's arguments. The delivery worker (gateway/webhooks/worker.py) sends the rows.

CREATE OR REPLACE FUNCTION gateway_webhook_time(p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$fn$;

CREATE OR REPLACE FUNCTION gateway_webhook_enqueue(p_tenant_id text, p_event text, p_data jsonb) RETURNS void
LANGUAGE sql AS $fn$
    INSERT INTO webhook_deliveries
           (id, tenant_id, subscription_id, event_type, data, created_at, state, attempts,
            next_attempt_at, window_started_at)
    SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), s.tenant_id, s.id, p_event, p_data,
           clock_timestamp(), 'pending', 0, clock_timestamp(), clock_timestamp()
      FROM webhook_subscriptions s
     WHERE s.tenant_id = p_tenant_id AND s.events ? p_event
$fn$;

CREATE OR REPLACE FUNCTION gateway_webhook_approval_event() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_event text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_event := 'approval.created';
    ELSIF NEW.status = 'expired' THEN
        v_event := 'approval.expired';
    ELSIF OLD.status = 'pending' AND NEW.status IN ('executing', 'rejected') THEN
        v_event := 'approval.decided';
    ELSE
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions s WHERE s.tenant_id = NEW.tenant_id AND s.events ? v_event) THEN
        RETURN NULL;
    END IF;
    PERFORM gateway_webhook_enqueue(NEW.tenant_id, v_event, jsonb_build_object(
        'approval_id', NEW.id,
        'tool', NEW.tool,
        'status', NEW.status,
        'decision', CASE NEW.status WHEN 'executing' THEN 'approved' WHEN 'rejected' THEN 'rejected' END,
        'requester_id', NEW.requester_id,
        'run_id', NEW.run_id,
        'tool_call_id', NEW.tool_call_id,
        'arguments_sha256', NEW.arguments_sha256,
        'created_at', gateway_webhook_time(NEW.created_at),
        'expires_at', gateway_webhook_time(NEW.expires_at),
        'decided_by', NEW.decided_by,
        'decided_at', gateway_webhook_time(NEW.decided_at),
        'outcome', CASE WHEN NEW.status = 'expired' THEN NEW.outcome END
    ));
    RETURN NULL;
END;
$fn$;

CREATE OR REPLACE FUNCTION gateway_webhook_run_event() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM webhook_subscriptions s WHERE s.tenant_id = NEW.tenant_id AND s.events ? 'run.stopped'
    ) THEN
        RETURN NULL;
    END IF;
    PERFORM gateway_webhook_enqueue(NEW.tenant_id, 'run.stopped', jsonb_build_object(
        'run_id', NEW.id,
        'user_id', NEW.user_id,
        'state', NEW.loop_state,
        'stop_reason', NEW.stop_reason,
        'steps', NEW.steps,
        'prompt_tokens', NEW.prompt_tokens,
        'completion_tokens', NEW.completion_tokens,
        'stopped_at', gateway_webhook_time(COALESCE(NEW.updated_at, clock_timestamp()))
    ));
    RETURN NULL;
END;
$fn$;

CREATE OR REPLACE TRIGGER approvals_webhook_created
    AFTER INSERT ON approvals
    FOR EACH ROW EXECUTE FUNCTION gateway_webhook_approval_event();

CREATE OR REPLACE TRIGGER approvals_webhook_status
    AFTER UPDATE OF status ON approvals
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION gateway_webhook_approval_event();

CREATE OR REPLACE TRIGGER runs_webhook_stopped
    AFTER UPDATE OF loop_state ON runs
    FOR EACH ROW WHEN (NEW.loop_state IN ('stopped', 'failed') AND OLD.loop_state IS DISTINCT FROM NEW.loop_state)
    EXECUTE FUNCTION gateway_webhook_run_event();
