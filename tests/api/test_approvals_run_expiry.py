"""An approval cannot execute after its run has expired: deciding it then expires it with
the outcome RUN_EXPIRED, stored for the held-back call and audited; nothing runs. PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support import db
from tests.support.approvals import CAROL, approve, reject, request_approval
from tests.support.calls import create_run, outcome, send_one
from tests.support.http import assert_error
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")
NOTE = {"text": "after the run"}


@pytest.fixture
async def held(pg_client, seeded_pg_url):
    """bob's run asked for a write that waits for approval; then the run expired."""
    run = await create_run(pg_client, BOB)
    approval_id = await request_approval(pg_client, run["id"], BOB, "w1", "write_note", NOTE)
    await db.expire_run(seeded_pg_url, run["id"])
    return run["id"], approval_id


async def test_approving_after_the_run_expired_is_run_expired_and_runs_nothing(pg_client, seeded_pg_url, probe, held):
    run_id, approval_id = held
    error = assert_error(await approve(pg_client, approval_id), 409, "RUN_EXPIRED")
    assert "expired" in error["message"]
    assert probe.executions == {}
    (row,) = await db.approvals(seeded_pg_url, id=approval_id)
    assert (row.status, row.outcome, row.decided_by) == ("expired", "RUN_EXPIRED", None)


async def test_the_held_back_call_then_answers_run_expired(pg_client, probe, held):
    run_id, approval_id = held
    await approve(pg_client, approval_id)
    content = await send_one(pg_client, run_id, BOB, "w1", "write_note", NOTE)
    assert outcome(content) == "RUN_EXPIRED" and content["error"]["retryable"] is False
    view = (await pg_client.get(f"/v1/approvals/{approval_id}", headers=BOB)).json()
    assert (view["status"], view["outcome"]["code"]) == ("expired", "RUN_EXPIRED")
    assert probe.executions == {}


async def test_rejecting_after_the_run_expired_is_run_expired_too(pg_client, seeded_pg_url, held):
    run_id, approval_id = held
    assert_error(await reject(pg_client, approval_id, "too late anyway"), 409, "RUN_EXPIRED")
    (row,) = await db.approvals(seeded_pg_url, id=approval_id)
    assert (row.status, row.outcome, row.reason) == ("expired", "RUN_EXPIRED", None)


async def test_every_later_decision_answers_run_expired(pg_client, probe, held):
    _, approval_id = held
    assert_error(await approve(pg_client, approval_id), 409, "RUN_EXPIRED")
    assert_error(await approve(pg_client, approval_id), 409, "RUN_EXPIRED")
    assert_error(await reject(pg_client, approval_id, "no"), 409, "RUN_EXPIRED")
    assert probe.executions == {}


async def test_the_refused_decision_is_audited_with_its_outcome(pg_client, seeded_pg_url, held):
    _, approval_id = held
    await pg_client.post(f"/v1/admin/approvals/{approval_id}/approve", headers={**CAROL, "X-Request-ID": "late-1"})
    rows = await db.audit_rows(seeded_pg_url, approval_id=approval_id, request_id="late-1")
    assert [(r.kind, r.user_id, r.outcome) for r in rows] == [("approval_decision", "carol", "RUN_EXPIRED")]


async def test_an_approval_whose_run_is_still_live_executes(pg_client, seeded_pg_url, probe):
    """The run check refuses only expired runs: one with a future expiry runs as before."""
    run = await create_run(pg_client, BOB, expires_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat())
    approval_id = await request_approval(pg_client, run["id"], BOB, "w1", "write_note", NOTE)
    assert (await approve(pg_client, approval_id)).json()["status"] == "succeeded"
    assert probe.executions == {"w1": 1}


async def test_a_pending_approval_of_an_expired_run_reads_as_expired_and_leaves_the_pending_list(pg_client, held):
    _, approval_id = held
    assert (await pg_client.get(f"/v1/approvals/{approval_id}", headers=BOB)).json()["status"] == "expired"
    assert (await pg_client.get(f"/v1/admin/approvals/{approval_id}", headers=CAROL)).json()["status"] == "expired"
    pending = (await pg_client.get("/v1/admin/approvals", params={"status": "pending"}, headers=CAROL)).json()
    expired = (await pg_client.get("/v1/admin/approvals", params={"status": "expired"}, headers=CAROL)).json()
    assert pending["items"] == [] and [item["id"] for item in expired["items"]] == [approval_id]
