"""Retention of runs (``gateway runs prune``): a run expired before the age goes with its tool
calls, repeat counts, messages and approvals, in batches, audited in its tenant's chain; a
run expired more recently, or with an approval still executing, stays."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest
from litestar.testing import AsyncTestClient

from gateway.admin import run_retention
from gateway.admin.run_retention import prune_expired_runs
from gateway.app import create_app
from gateway.db.engine import Database
from gateway.settings import Settings
from tests.support.app import make_settings, seeded
from tests.support.calls import call_tools, new_run, tool_call
from tests.support.processes import run_cli
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

PER_RUN_TABLES = ("tool_calls", "run_call_counts", "approvals", "run_messages", "mcp_token_runs")


async def _connect(pg_url: str) -> asyncpg.Connection:
    return await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://", 1))


async def _rows_of(pg_url: str, run_id: str) -> dict[str, int]:
    conn = await _connect(pg_url)
    try:
        found = {"runs": await conn.fetchval("SELECT count(*) FROM runs WHERE id = $1", run_id)}
        for table in PER_RUN_TABLES:
            found[table] = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE run_id = $1", run_id)
        return found
    finally:
        await conn.close()


async def _expired(pg_url: str, run_id: str, days_ago: float) -> None:
    conn = await _connect(pg_url)
    try:
        await conn.execute(
            "UPDATE runs SET expires_at = now() - make_interval(secs => $2) WHERE id = $1", run_id, days_ago * 86400
        )
    finally:
        await conn.close()


@pytest.fixture
async def client(pg_url: str):
    await seeded(pg_url)
    async with AsyncTestClient(app=create_app(make_settings(pg_url))) as test_client:
        yield test_client


@pytest.fixture
async def db(pg_url: str):
    database = Database.from_settings(Settings.from_flat(database_url=pg_url))
    yield database
    await database.dispose()


async def _run_with_history(client, user: str = "bob", tenant: str = "acme") -> str:
    """A run with a call done, a repeat counted, an approval pending and a message stored."""
    run = await new_run(client, user, tenant)
    await call_tools(client, run, [tool_call("add", {"a": 2, "b": 3}), tool_call("add", {"a": 2, "b": 3}),
                                   tool_call("create_article", {"title": "T", "body": "B"})], user, tenant)
    return run


async def test_runs_expired_before_the_age_go_with_everything_kept_for_them(client, db, pg_url):
    old, recent, live = [await _run_with_history(client) for _ in range(3)]
    await _expired(pg_url, old, days_ago=31)
    await _expired(pg_url, recent, days_ago=29)
    before = await _rows_of(pg_url, old)
    assert before["runs"] == 1 and before["tool_calls"] == 3 and before["run_call_counts"] >= 1
    assert before["approvals"] == 1

    assert await prune_expired_runs(db, older_than=timedelta(days=30)) == {"acme": (1, 3)}

    assert set((await _rows_of(pg_url, old)).values()) == {0}
    for kept in (recent, live):
        rows = await _rows_of(pg_url, kept)
        assert rows["runs"] == 1 and rows["tool_calls"] == 3 and rows["approvals"] == 1
    gone = await client.get(f"/v1/runs/{old}", headers=auth_for("bob"))
    assert gone.status_code == 404


async def test_a_prune_is_audited_in_each_tenants_chain(client, db, pg_url):
    acme_run, globex_run = await _run_with_history(client), await _run_with_history(client, "bob", "globex")
    for run in (acme_run, globex_run):
        await _expired(pg_url, run, days_ago=2)
    removed = await prune_expired_runs(db, older_than=timedelta(days=1))
    assert removed == {"acme": (1, 3), "globex": (1, 3)}
    conn = await _connect(pg_url)
    try:
        rows = await conn.fetch(
            "SELECT tenant_id, user_id, detail FROM audit_events WHERE kind = 'admin_change' AND detail->>'action' = 'runs.prune' ORDER BY tenant_id"
        )
    finally:
        await conn.close()
    assert [(row["tenant_id"], row["user_id"]) for row in rows] == [("acme", "operator:cli"), ("globex", "operator:cli")]
    assert all('"removed_runs": 1' in row["detail"] and '"removed_tool_calls": 3' in row["detail"] for row in rows)


async def test_a_backlog_goes_in_batches_each_its_own_transaction(client, db, pg_url, monkeypatch):
    monkeypatch.setattr(run_retention, "BATCH", 2)
    runs = [await new_run(client, "alice") for _ in range(5)]
    for run in runs:
        await _expired(pg_url, run, days_ago=3)
    assert await prune_expired_runs(db, older_than=timedelta(days=1)) == {"acme": (5, 0)}
    assert [(await _rows_of(pg_url, run))["runs"] for run in runs] == [0] * 5
    conn = await _connect(pg_url)
    try:
        batches = await conn.fetchval("SELECT count(*) FROM audit_events WHERE kind = 'admin_change' AND detail->>'action' = 'runs.prune'")
    finally:
        await conn.close()
    assert batches == 3  # 2 + 2 + 1: each batch audited with what it removed


@pytest.mark.parametrize(("table", "done"), [("approvals", "succeeded"), ("tool_calls", "done")])
async def test_a_run_with_an_approval_or_a_call_still_executing_stays(client, db, pg_url, table, done):
    """A call (or an approved one) admitted just before its run expired may still be running:
    its outcome is still to be recorded, and a retry of its id must find it."""
    run = await _run_with_history(client)
    await _expired(pg_url, run, days_ago=3)
    conn = await _connect(pg_url)
    try:
        await conn.execute(f"UPDATE {table} SET status = 'executing' WHERE run_id = $1", run)
        assert await prune_expired_runs(db, older_than=timedelta(days=1)) == {}
        assert (await _rows_of(pg_url, run))["runs"] == 1
        await conn.execute(f"UPDATE {table} SET status = '{done}' WHERE run_id = $1", run)
    finally:
        await conn.close()
    assert await prune_expired_runs(db, older_than=timedelta(days=1)) == {"acme": (1, 3)}


async def test_a_run_locked_by_a_request_is_skipped_not_waited_for(client, db, pg_url):
    locked, free = await new_run(client, "alice"), await new_run(client, "alice")
    for run in (locked, free):
        await _expired(pg_url, run, days_ago=3)
    holder = await _connect(pg_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", locked)
            removed = await asyncio.wait_for(prune_expired_runs(db, older_than=timedelta(days=1)), timeout=30)
            assert removed == {"acme": (1, 0)}
    finally:
        await holder.close()
    assert (await _rows_of(pg_url, locked))["runs"] == 1 and (await _rows_of(pg_url, free))["runs"] == 0


async def test_the_cli_prunes_and_refuses_a_bad_age(client, pg_url):
    run = await _run_with_history(client)
    await _expired(pg_url, run, days_ago=10)
    done = await asyncio.to_thread(run_cli, pg_url, "runs", "prune", "--older-than", "1w")
    assert done.returncode == 0, done.stderr
    assert "tenant acme: removed 1 run(s) and 3 tool call(s)" in done.stdout
    again = await asyncio.to_thread(run_cli, pg_url, "runs", "prune", "--older-than", "1w")
    assert again.returncode == 0 and "nothing to prune" in again.stdout
    for bad in ("0d", "7", "-1d", "x" * 100):
        refused = await asyncio.to_thread(run_cli, pg_url, "runs", "prune", f"--older-than={bad}")
        assert refused.returncode == 1 and "is not an age" in refused.stderr and "Traceback" not in refused.stderr
