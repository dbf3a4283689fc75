-- Audit rows are append-only, enforced by the database and not only by the code's habits.
--
-- A change to a row is refused unless it is the sealer linking a row not yet sealed into its
-- tenant's chain: the row had no chain_seq and nothing but the chain's own columns changes.
-- A sealed row is never changed again. The columns are compared as a whole row, so a column
-- added later is covered without touching this file.
--
-- A deletion is refused unless every removed row is sealed and already behind its tenant's
-- anchor (audit_chains.anchor_seq): the prune moves the anchor to the last row it removes,
-- then removes the rows. The anchor keeps the removed prefix verifiable, so only a
-- retention that kept the chain's promise can delete. Checked once per statement, over
-- the rows it removed.
--
-- The table's owner can still disable these triggers (ALTER TABLE ... DISABLE TRIGGER) or
-- TRUNCATE the table: against someone with owner rights the hash chain and a signed anchor
-- are the defence; these triggers close every other path, the gateway's own code included.
-- The row is compared as a record (NEW with the chain's columns put back as they were):
-- it runs once for every row the sealer links, and a record comparison costs a quarter of
-- what comparing the two rows as JSON did.
CREATE OR REPLACE FUNCTION gateway_audit_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_unchained audit_events;
BEGIN
    IF OLD.chain_seq IS NULL THEN
        v_unchained := NEW;
        v_unchained.chain_seq := OLD.chain_seq;
        v_unchained.content_hash := OLD.content_hash;
        v_unchained.prev_hash := OLD.prev_hash;
        v_unchained.chain_hash := OLD.chain_hash;
        IF v_unchained IS NOT DISTINCT FROM OLD THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit rows are append-only: row % cannot be changed', OLD.id
        USING HINT = 'only the sealer links a row that is not sealed yet into its chain';
END;
$fn$;

CREATE OR REPLACE FUNCTION gateway_audit_guard_delete() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    SELECT g.id INTO v_id
      FROM gone g LEFT JOIN audit_chains c ON c.tenant_id = g.tenant_id
     WHERE g.chain_seq IS NULL OR c.anchor_seq IS NULL OR g.chain_seq > c.anchor_seq
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'audit rows are append-only: row % is not behind its chain''s anchor', v_id
            USING HINT = 'only a prune that moved the anchor past a row removes it';
    END IF;
    RETURN NULL;
END;
$fn$;

CREATE OR REPLACE TRIGGER audit_events_append_only_update
    BEFORE UPDATE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION gateway_audit_guard_update();

CREATE OR REPLACE TRIGGER audit_events_append_only_delete
    AFTER DELETE ON audit_events
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION gateway_audit_guard_delete();
