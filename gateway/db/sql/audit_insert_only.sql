-- Audit rows are insert-only, enforced by the database and not only by the code's habits
-- (migration 0013; it replaces the append-only guard of audit_append_only.sql).
--
-- audit_events: every UPDATE and every DELETE is refused, row by row (a BEFORE trigger on the
-- partitioned table is cloned to every partition, those made later included). Nothing
-- changes a written row any more: the sealer links a row into its tenant's chain by
-- inserting a narrow row in audit_links. Retention never deletes rows either: it drops the
-- partition of a whole month once every row of it is behind its tenant's anchor
-- (gateway/audit/prune.py). Moving rows out of the default partition into a month made for
-- them (gateway_audit_add_partition, audit_partitions.sql) switches the delete trigger of
-- the default partition off for that statement, inside its transaction.
--
-- audit_links: a link is never changed; it is deleted only once its chain position is behind
-- its tenant's anchor (audit_chains.anchor_seq), checked once per statement over the rows it
-- removed: the prune moves the anchor first, then removes the links of the months it drops.
--
-- The tables' owner can still disable these triggers, drop a partition or TRUNCATE: against
-- someone with owner rights the hash chain and a signed anchor are the defence; these
-- triggers close every other path, the gateway's own code included.
CREATE OR REPLACE FUNCTION gateway_audit_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'audit rows are append-only: row % cannot be changed', OLD.id
            USING HINT = 'an audit row is never changed: the sealer links it into its chain in audit_links';
    END IF;
    RAISE EXCEPTION 'audit rows are append-only: row % cannot be deleted', OLD.id
        USING HINT = 'retention drops the partitions of whole months behind the chains'' anchors';
END;
$fn$;

CREATE OR REPLACE TRIGGER audit_events_insert_only_update
    BEFORE UPDATE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION gateway_audit_refuse_change();

CREATE OR REPLACE TRIGGER audit_events_insert_only_delete
    BEFORE DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION gateway_audit_refuse_change();

CREATE OR REPLACE FUNCTION gateway_audit_link_refuse_update() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'audit rows are append-only: the link of row % (chain position %) cannot be changed',
        OLD.audit_id, OLD.chain_seq
        USING HINT = 'a sealed row is never relinked';
END;
$fn$;

CREATE OR REPLACE FUNCTION gateway_audit_link_guard_delete() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    SELECT g.audit_id INTO v_id
      FROM gone g LEFT JOIN audit_chains c ON c.tenant_id = g.tenant_id
     WHERE c.anchor_seq IS NULL OR g.chain_seq > c.anchor_seq
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'audit rows are append-only: row % is not behind its chain''s anchor', v_id
            USING HINT = 'only a prune that moved the anchor past a row removes its link';
    END IF;
    RETURN NULL;
END;
$fn$;

CREATE OR REPLACE TRIGGER audit_links_insert_only_update
    BEFORE UPDATE ON audit_links
    FOR EACH ROW EXECUTE FUNCTION gateway_audit_link_refuse_update();

CREATE OR REPLACE TRIGGER audit_links_insert_only_delete
    AFTER DELETE ON audit_links
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION gateway_audit_link_guard_delete();
