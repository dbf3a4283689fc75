"""A call that changes data commits with its outcome and audit row, or not at all.

The recording is made to fail (a trigger refuses the call's successful audit row); the
call's own write must then be rolled back, and the failure recorded instead."""

from __future__ import annotations

import json

import asyncpg
import pytest

from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.support.app import make_settings, seeded
from tests.support.calls import call_tools, new_run, outcome, tool_call
from tests.support.db import set_approval_mode
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_client(pg_url: str):
    """These tests add a trigger to the schema, so they get a database of their own."""
    await seeded(pg_url)
    async with AsyncTestClient(app=create_app(make_settings(pg_url))) as client:
        yield client

REFUSE_SUCCESS_AUDIT = """
CREATE FUNCTION refuse_success_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'tool_call' AND NEW.tool = 'create_article' AND NEW.outcome = 'OK' THEN
        RAISE EXCEPTION 'audit storage refused the row';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_success_audit BEFORE INSERT ON audit_events
    FOR EACH ROW EXECUTE FUNCTION refuse_success_audit();
"""


async def _sql(pg_url: str, statement: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return await conn.fetch(statement, *args) if args else [await conn.execute(statement)]
    finally:
        await conn.close()


async def _articles_titled(pg_url: str, title: str) -> int:
    [row] = await _sql(pg_url, "SELECT count(*) AS n FROM articles WHERE title = $1", title)
    return int(row["n"])


async def test_an_approved_call_whose_recording_fails_leaves_no_write_behind(pg_client, pg_url):
    run = await new_run(pg_client, "bob")
    [held] = await call_tools(pg_client, run, [tool_call("create_article", {"title": "Atomic", "body": "B"})], "bob")
    await _sql(pg_url, REFUSE_SUCCESS_AUDIT)

    response = await pg_client.post(
        f"/v1/admin/approvals/{held['error']['approval_id']}/approve", headers=auth_for("carol")
    )
    assert response.status_code == 200
    assert response.json()["outcome"]["code"] == "TOOL_EXECUTION_FAILED"
    assert "audit storage" not in response.text
    assert await _articles_titled(pg_url, "Atomic") == 0
    [stored] = await _sql(
        pg_url, "SELECT outcome FROM tool_calls WHERE run_id = $1", run
    )
    assert stored["outcome"] == "TOOL_EXECUTION_FAILED"


async def test_an_approved_call_that_records_fine_commits_its_write_once(pg_client, pg_url):
    run = await new_run(pg_client, "bob")
    [held] = await call_tools(pg_client, run, [tool_call("create_article", {"title": "Once", "body": "B"})], "bob")
    response = await pg_client.post(
        f"/v1/admin/approvals/{held['error']['approval_id']}/approve", headers=auth_for("carol")
    )
    assert response.json()["outcome"]["code"] == "OK"
    assert await _articles_titled(pg_url, "Once") == 1


async def test_a_mutating_call_admitted_without_approval_is_atomic_with_its_record(pg_client, pg_url):
    """Needs the executor to run CallPlan.transactional calls through TransactionalCalls.run_plan."""
    await set_approval_mode(pg_url, "create_article", "never")
    await _sql(pg_url, REFUSE_SUCCESS_AUDIT)
    run = await new_run(pg_client, "bob")
    response = await pg_client.post(
        f"/v1/runs/{run}/tool-calls",
        json={"tool_calls": [tool_call("create_article", {"title": "Direct", "body": "B"})]},
        headers=auth_for("bob"),
    )
    assert response.status_code == 200, response.text
    content = json.loads(response.json()["messages"][0]["content"])
    assert outcome(content) == "TOOL_EXECUTION_FAILED"
    assert await _articles_titled(pg_url, "Direct") == 0
