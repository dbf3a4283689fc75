"""A write that fails to commit is an error, never a 2xx (a trigger makes the database refuse)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.support import db
from tests.support.app import make_settings, seeded
from tests.support.approvals import approve, request_approval
from tests.support.calls import batch, create_run, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for

ALICE, BOB = auth_for("alice"), auth_for("bob")

REFUSE_OK_AUDIT = [
    """CREATE FUNCTION refuse_ok() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN IF NEW.outcome = 'OK' THEN RAISE EXCEPTION 'refused by test'; END IF; RETURN NEW; END $$""",
    "CREATE TRIGGER refuse_ok BEFORE INSERT ON audit_events FOR EACH ROW EXECUTE FUNCTION refuse_ok()",
]


@pytest.fixture
def refusing_url(pg_url: str) -> str:
    """A fresh seeded database whose audit refuses rows with outcome OK."""
    url = pg_url

    async def prepare() -> None:
        await seeded(url)
        async with db.open_database(url) as database, database.begin() as conn:
            for statement in REFUSE_OK_AUDIT:
                await conn.execute(sa.text(statement))

    asyncio.run(prepare())
    return url


@pytest.fixture
async def refusing(refusing_url: str) -> AsyncIterator[tuple[AsyncTestClient, str]]:
    async with AsyncTestClient(app=create_app(make_settings(refusing_url))) as client:
        yield client, refusing_url


async def test_an_outcome_that_cannot_be_recorded_is_an_error_not_a_success(refusing):
    client, _ = refusing
    run = await create_run(client, ALICE)
    call = tool_call("add", {"a": 1, "b": 2}, call_id="c1")
    response = await client.post(f"/v1/runs/{run['id']}/tool-calls", json=batch(call), headers=ALICE)
    error = assert_error(response, 500, "INTERNAL_ERROR")
    assert "refused by test" not in response.text and error["error_id"]


async def test_an_approved_execution_that_cannot_be_recorded_is_not_committed(refusing):
    client, url = refusing
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "create_article", {"title": "Lost", "body": "b"})
    await approve(client, approval_id)
    assert await db.articles(url, title="Lost") == []
    (row,) = await db.approvals(url, id=approval_id)
    assert row.status != "succeeded"
