"""The hot path's tables are keyed by tenant first (migration 0020): every key and index of
theirs leads with ``tenant_id``, a row cannot name another tenant's run, and a run id is one
tenant's only, so two tenants' runs that share an id are admitted, counted and recorded each
against its own. PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.exc import IntegrityError

from gateway.auth.principal import Principal
from gateway.db.migrate import alembic_config, check_models_match
from gateway.db.approvals import get_approval
from gateway.db.models import Approval, Run, RunCallCount, ToolCall
from gateway.execution.approvals import idempotency_key_for
from gateway.execution.ledger import FinishedCall
from gateway.execution.runner import OK
from tests.integration.test_admission_paths import (
    ALICE,
    APPROVAL_TTL,
    STALE_AFTER,
    START,
    Call,
    PathLedger,
    Request,
    item_of,
    plan_of,
)
from tests.support import db as support

HOT_PATH_TABLES = (
    "runs", "tool_calls", "run_call_counts", "approvals", "run_messages", "mcp_token_runs",
    "audit_events", "audit_links", "audit_chains", "tool_policies", "rate_limit_buckets", "rate_limit_overrides",
    "roles", "role_permissions", "users", "webhook_subscriptions", "webhook_deliveries",
)
ACROSS_TENANTS = {"ix_audit_events_txid_id", "ix_webhook_deliveries_due", "ix_runs_expires_at"}
"""The sealer's work list (the order in which transactions wrote audit rows), the webhook
worker's (deliveries due) and the runs' retention's (runs by expiry), across tenants."""

INDEXES = """
SELECT c.relname AS table_name, i.relname AS index_name, a.attname AS first_column
  FROM pg_index x
  JOIN pg_class c ON c.oid = x.indrelid
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = x.indkey[0]
 WHERE n.nspname = 'public' AND c.relname = ANY(:tables)
"""

GLOBEX_ALICE = Principal("globex", "alice", frozenset({"editor"}), frozenset({"calculator:use", "articles:write"}))
"""Another tenant's user with the same user id as ALICE."""


async def test_every_key_and_index_of_the_hot_path_leads_with_the_tenant(pg_url):
    indexes = await support.rows(pg_url, sa.text(INDEXES).bindparams(tables=list(HOT_PATH_TABLES)))
    assert {row.table_name for row in indexes} == set(HOT_PATH_TABLES)
    not_by_tenant = {row.index_name for row in indexes if row.first_column != "tenant_id"}
    assert not_by_tenant == ACROSS_TENANTS


PRIMARY_KEYS = {
    "runs": ["tenant_id", "id"],
    "tool_calls": ["tenant_id", "run_id", "tool_call_id"],
    "run_call_counts": ["tenant_id", "run_id", "call_hash"],
    "approvals": ["tenant_id", "id"],
    "run_messages": ["tenant_id", "run_id", "seq"],
    "webhook_subscriptions": ["tenant_id", "id"],
    "webhook_deliveries": ["tenant_id", "id"],
}

KEY_COLUMNS = """
SELECT c.relname AS table_name, array_agg(a.attname::text ORDER BY k.n) AS columns
  FROM pg_constraint con
  JOIN pg_class c ON c.oid = con.conrelid
 CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, n)
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
 WHERE con.contype = 'p' AND c.relname = ANY(:tables)
 GROUP BY c.relname
"""


async def test_the_re_keyed_tables_have_exactly_their_keys(pg_url):
    # Alembic compares no primary keys: a key on the wrong second column would pass it.
    keys = await support.rows(pg_url, sa.text(KEY_COLUMNS).bindparams(tables=list(PRIMARY_KEYS)))
    assert {row.table_name: list(row.columns) for row in keys} == PRIMARY_KEYS


def test_two_tenants_approvals_sharing_an_id_send_different_idempotency_keys():
    assert idempotency_key_for("acme", "apr_1") != idempotency_key_for("globex", "apr_1")
    assert idempotency_key_for("acme", "apr_1") == idempotency_key_for("acme", "apr_1")


async def _two_tenants(url: str) -> None:
    await support.execute(url, sa.text(
        "INSERT INTO tenants (id, name, created_at) VALUES ('acme', 'Acme', now()), ('globex', 'Globex', now())"
    ))


@pytest.mark.parametrize("statement", [
    "INSERT INTO run_messages (tenant_id, run_id, seq, message, created_at) "
    "VALUES ('globex', 'run_a', 0, '{}', now())",
    "INSERT INTO approvals (id, tenant_id, run_id, tool_call_id, requester_id, requester_roles, tool, "
    "canonical_arguments, arguments_sha256, status, created_at, expires_at) "
    "VALUES ('apr_x', 'globex', 'run_a', 'c1', 'alice', '[]', 'create_article', '{}', 'h', 'pending', now(), now())",
    "INSERT INTO mcp_token_runs (tenant_id, user_id, token_key, run_id, expires_at, created_at) "
    "VALUES ('globex', 'alice', 'k', 'run_a', now(), now())",
], ids=["run_messages", "approvals", "mcp_token_runs"])
async def test_a_row_cannot_name_another_tenants_run(pg_url, statement):
    await _two_tenants(pg_url)
    await support.execute(pg_url, sa.text(
        "INSERT INTO runs (id, tenant_id, user_id, max_tool_calls, max_repeats, created_at) "
        "VALUES ('run_a', 'acme', 'alice', 10, 3, now())"
    ))
    with pytest.raises(IntegrityError, match="foreign key"):
        await support.execute(pg_url, sa.text(statement))


async def test_two_tenants_runs_sharing_an_id_are_each_admitted_against_their_own(db):
    run_id = "run_" + uuid.uuid4().hex
    async with db.begin() as conn:
        for tenant, budget in (("acme", 1), ("globex", 5)):
            await conn.execute(sa.insert(Run).values(
                id=run_id, tenant_id=tenant, user_id="alice", max_tool_calls=budget, max_repeats=5,
                used_tool_calls=0, created_at=START,
            ))
    ledger = PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER)
    same_ids = (Call("c1"), Call("c2", arguments='{"a": 2, "b": 2}'))
    try:
        async with db.driver() as conn:
            # One statement: both tenants' batches name the run id and the same call ids.
            acme, globex = await ledger._admit_many(conn, [
                item_of(Request(0, same_ids, principal=ALICE), run_id),
                item_of(Request(0, same_ids, principal=GLOBEX_ALICE), run_id),
            ])
        finished = [FinishedCall(plan_of(call, GLOBEX_ALICE), OK, f'{{"from":"{call.id}"}}', 0.5) for call in same_ids]
        await ledger.record(GLOBEX_ALICE, run_id, finished, request_id="req_rec", now=START)
    finally:
        await ledger.close()

    assert acme is not None and globex is not None
    # A run id with two owners is never the common case: the batches go as JSON, call by call.
    assert ledger.went_as_json == [True] and ledger.went_call_by_call == [True]
    # acme's run had budget for one call, globex's for five: neither saw the other's calls.
    assert [(a.tool_call_id, a.decision, a.outcome) for a in acme] == [
        ("c1", "execute", None), ("c2", "decided", "BUDGET_EXCEEDED"),
    ]
    assert [(a.tool_call_id, a.decision) for a in globex] == [("c1", "execute"), ("c2", "execute")]
    async with db.connect() as conn:
        used = dict((await conn.execute(
            sa.select(Run.tenant_id, Run.used_tool_calls).where(Run.id == run_id))).all())
        calls = (await conn.execute(
            sa.select(ToolCall.tenant_id, ToolCall.tool_call_id, ToolCall.status, ToolCall.content)
            .where(ToolCall.run_id == run_id).order_by(ToolCall.tenant_id, ToolCall.tool_call_id))).all()
        counted = dict((await conn.execute(
            sa.select(RunCallCount.tenant_id, sa.func.sum(RunCallCount.count))
            .where(RunCallCount.run_id == run_id).group_by(RunCallCount.tenant_id))).all())
    assert used == {"acme": 1, "globex": 2}
    assert counted == {"acme": 1, "globex": 2}
    # globex's record reached its own calls only; acme's executing call is still its own.
    assert [tuple(row) for row in calls] == [
        ("acme", "c1", "executing", None),
        ("acme", "c2", "done", calls[1].content),
        ("globex", "c1", "done", '{"from":"c1"}'),
        ("globex", "c2", "done", '{"from":"c2"}'),
    ]
    assert "BUDGET_EXCEEDED" in calls[1].content


async def test_a_delivery_cannot_name_another_tenants_subscription(pg_url):
    await _two_tenants(pg_url)
    await support.execute(pg_url, sa.text(
        "INSERT INTO webhook_subscriptions (id, tenant_id, url, events, format, secret, created_by, created_at) "
        "VALUES ('whk_a', 'acme', 'https://hooks.example/a', '[\"approval.created\"]', 'standard', 's', 'ann', now())"
    ))
    with pytest.raises(IntegrityError, match="foreign key"):
        await support.execute(pg_url, sa.text(
            "INSERT INTO webhook_deliveries (id, tenant_id, subscription_id, event_type, data, created_at, "
            "next_attempt_at, window_started_at) "
            "VALUES ('msg_x', 'globex', 'whk_a', 'approval.created', '{}', now(), now(), now())"
        ))


LEGACY = """
INSERT INTO tenants (id, name, created_at) VALUES ('acme', 'Acme', now()), ('globex', 'Globex', now());
INSERT INTO runs (id, tenant_id, user_id, max_tool_calls, max_repeats, used_tool_calls, created_at)
    VALUES ('run_1', 'acme', 'alice', 10, 3, 2, now()), ('run_2', 'globex', 'bob', 10, 3, 1, now());
INSERT INTO run_call_counts (run_id, call_hash, count)
    VALUES ('run_1', 'h1', 2), ('run_2', 'h1', 1), ('run_gone', 'h1', 4);
INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, status, created_at)
    VALUES ('run_1', 'c1', 'acme', 'add', 'done', now()), ('run_2', 'c1', 'globex', 'add', 'executing', now());
INSERT INTO run_messages (run_id, seq, tenant_id, message, created_at) VALUES ('run_1', 0, 'acme', '{}', now());
INSERT INTO webhook_subscriptions (id, tenant_id, url, events, format, secret, created_by, created_at)
    VALUES ('whk_1', 'globex', 'https://hooks.example/g', '["run.stopped"]', 'standard', 's', 'ann', now());
INSERT INTO webhook_deliveries (id, tenant_id, subscription_id, event_type, data, created_at, next_attempt_at,
                                window_started_at)
    VALUES ('msg_1', 'globex', 'whk_1', 'run.stopped', '{}', now(), now(), now())
"""


async def test_upgrading_fills_each_count_with_its_runs_tenant_and_drops_counts_of_no_run(pg_url):
    config = alembic_config(pg_url)
    await asyncio.to_thread(command.downgrade, config, "0019")
    for statement in LEGACY.split(";"):
        await support.execute(pg_url, sa.text(statement))

    await asyncio.to_thread(command.upgrade, config, "head")

    counts = await support.rows(pg_url, sa.text(
        "SELECT tenant_id, run_id, count FROM run_call_counts ORDER BY run_id"))
    assert [tuple(row) for row in counts] == [("acme", "run_1", 2), ("globex", "run_2", 1)]
    calls = await support.rows(pg_url, sa.text("SELECT tenant_id, run_id FROM tool_calls ORDER BY run_id"))
    assert [tuple(row) for row in calls] == [("acme", "run_1"), ("globex", "run_2")]
    deliveries = await support.rows(pg_url, sa.text("SELECT tenant_id, id, subscription_id FROM webhook_deliveries"))
    assert [tuple(row) for row in deliveries] == [("globex", "msg_1", "whk_1")]
    await asyncio.to_thread(check_models_match, pg_url)


async def test_the_functions_still_admit_after_a_downgrade(pg_url):
    # Downgrade restores 0019's keys and leaves 0020's functions, which must work on them.
    await _two_tenants(pg_url)
    await asyncio.to_thread(command.downgrade, alembic_config(pg_url), "0019")
    run_id = "run_" + uuid.uuid4().hex
    await support.execute(pg_url, sa.text(
        "INSERT INTO runs (id, tenant_id, user_id, max_tool_calls, max_repeats, created_at) "
        f"VALUES ('{run_id}', 'acme', 'alice', 10, 1, now())"
    ))
    async with support.open_database(pg_url) as database:
        ledger = PathLedger(database, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER)
        try:
            async with database.driver() as conn:
                (first,) = await ledger._admit_many(conn, [item_of(Request(0, (Call("c1"), Call("c2"))), run_id)])
                (again,) = await ledger._admit_many(conn, [item_of(Request(0, (Call("c1"),)), run_id)])
        finally:
            await ledger.close()
    assert first is not None and again is not None
    assert [(a.decision, a.outcome) for a in first] == [("execute", None), ("decided", "REPEATED_CALL")]
    assert [(a.decision, a.outcome) for a in again] == [("replay", "TOOL_CALL_IN_PROGRESS")]


APPROVALS_FETCHED = (
    "SELECT coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables WHERE relname = 'approvals'"
)


async def test_an_approval_is_read_by_its_key_once_the_table_has_statistics(db):
    # Three indexes of approvals lead with tenant_id. Without statistics the planner costs them
    # alike for a lookup by id; with them (autoanalyze) it must replan a plan a connection kept
    # and read the one approval by the primary key, not the tenant's approvals through another.
    prefix = uuid.uuid4().hex[:12]

    async def insert(count: int) -> str:
        ids = [f"{prefix}_{uuid.uuid4().hex[:8]}" for _ in range(count)]
        async with db.begin() as conn:
            await conn.execute(sa.insert(Run), [
                dict(id="run_" + i, tenant_id="acme", user_id="bob", max_tool_calls=10, max_repeats=3,
                     used_tool_calls=0, created_at=START) for i in ids])
            await conn.execute(sa.insert(Approval), [
                dict(id="apr_" + i, tenant_id="acme", run_id="run_" + i, tool_call_id="c1", requester_id="bob",
                     requester_roles=["editor"], tool="create_article", canonical_arguments="{}",
                     arguments_sha256="h", status="pending", created_at=START, expires_at=START) for i in ids])
        return "apr_" + ids[0]

    wanted = await insert(1)
    async with db.connect() as conn:
        for _ in range(8):  # past the executions after which a prepared statement may go generic
            assert (await get_approval(conn, tenant_id="acme", approval_id=wanted)) is not None
            await conn.commit()
        await insert(2000)
        async with db.begin() as other:
            await other.execute(sa.text("ANALYZE approvals"))
        before = await conn.scalar(sa.text(APPROVALS_FETCHED))
        row = await get_approval(conn, tenant_id="acme", approval_id=wanted)
        fetched = await conn.scalar(sa.text(APPROVALS_FETCHED)) - before
    assert row is not None and row.id == wanted
    assert fetched == 1
