"""Migration 0006 on a database that already holds approvals and tool calls: the frozen
arguments become text, stored calls get the arguments hash their audit row carries, and
the migration downgrades and upgrades again. PostgreSQL."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from alembic import command

from gateway.db.migrate import alembic_config, check_models_match
from tests.support import db

NOW = "2026-11-30T12:00:00+00"
LEGACY = """
INSERT INTO tenants (id, name, created_at) VALUES ('acme', 'Acme', '{now}');
INSERT INTO runs (id, tenant_id, user_id, max_tool_calls, max_repeats, created_at)
    VALUES ('run_1', 'acme', 'bob', 10, 3, '{now}');
INSERT INTO approvals (id, tenant_id, run_id, tool_call_id, requester_id, requester_roles, tool, arguments,
                       arguments_sha256, status, created_at, expires_at)
    VALUES ('apr_1', 'acme', 'run_1', 'c1', 'bob', '["editor"]', 'write_note', '{{"text": "hi", "n": 1.5}}',
            'hash-apr', 'pending', '{now}', '{now}');
INSERT INTO tool_calls (run_id, tool_call_id, tenant_id, tool, status, approval_id, created_at)
    VALUES ('run_1', 'c1', 'acme', 'write_note', 'approval', 'apr_1', '{now}'),
           ('run_1', 'c2', 'acme', 'add', 'done', NULL, '{now}');
INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments_sha256, outcome, created_at)
    VALUES ('acme', 'tool_call_replay', 'bob', 'run_1', 'c1', 'write_note', 'hash-of-a-replay', 'APPROVAL_REQUIRED',
            '{now}'),
           ('acme', 'tool_call', 'bob', 'run_1', 'c1', 'write_note', 'hash-c1', 'APPROVAL_REQUIRED', '{now}');
"""


async def _statements(url: str, sql: str) -> None:
    for statement in sql.strip().split(";"):
        if statement.strip():
            await db.execute(url, sa.text(statement))


async def test_upgrading_keeps_the_frozen_arguments_and_the_stored_calls_hashes(pg_url):
    config = alembic_config(pg_url)
    await asyncio.to_thread(command.downgrade, config, "0005")
    await _statements(pg_url, LEGACY.format(now=NOW))

    await asyncio.to_thread(command.upgrade, config, "head")

    (approval,) = await db.rows(pg_url, sa.text("SELECT * FROM approvals"))
    assert approval.canonical_arguments == '{"n":1.5,"text":"hi"}'  # what the executor used to rebuild
    assert "arguments" not in approval._mapping
    calls = {row.tool_call_id: row for row in await db.rows(pg_url, sa.text("SELECT * FROM tool_calls"))}
    assert calls["c1"].arguments_sha256 == "hash-c1"  # from its own audit row, not a replay's
    assert calls["c2"].arguments_sha256 is None  # no audit row left: matches no later call
    await asyncio.to_thread(check_models_match, pg_url)


async def test_downgrading_restores_the_jsonb_arguments(pg_url):
    config = alembic_config(pg_url)
    await asyncio.to_thread(command.downgrade, config, "0005")
    await _statements(pg_url, LEGACY.format(now=NOW))
    await asyncio.to_thread(command.upgrade, config, "head")

    await asyncio.to_thread(command.downgrade, config, "0005")

    (approval,) = await db.rows(pg_url, sa.text("SELECT arguments FROM approvals"))
    assert approval.arguments == {"n": 1.5, "text": "hi"}
    columns = await db.rows(
        pg_url, sa.text("SELECT column_name FROM information_schema.columns WHERE table_name = 'tool_calls'")
    )
    assert "arguments_sha256" not in {c.column_name for c in columns}
