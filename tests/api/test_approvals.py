"""Approvals: a mutating call waits for an administrator; the frozen call runs once, as its
requester; every decision is final."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from gateway.db.models import Approval, RolePermission
from gateway.execution.approvals import idempotency_key_for
from tests.support import db
from tests.support.approvals import CAROL, approve, reject, request_approval
from tests.support.calls import create_run, outcome, send_one
from tests.support.http import assert_error
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

ALICE, BOB = auth_for("alice"), auth_for("bob")
NEW_ARTICLE = {"title": "Quarterly numbers", "body": "Up and to the right."}


@pytest.fixture
async def pending(client):
    """bob asked to create an article; carol has not decided yet."""
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "call_1", "create_article", NEW_ARTICLE)
    return run["id"], approval_id


async def resend(client, run_id: str) -> dict:
    return await send_one(client, run_id, BOB, "call_1", "create_article", NEW_ARTICLE)


# --- requesting ---------------------------------------------------------------------------


async def test_a_mutating_call_answers_approval_required_with_an_approval_id(client, database_url):
    run = await create_run(client, BOB)
    content = await send_one(client, run["id"], BOB, "call_1", "create_article", NEW_ARTICLE)
    assert outcome(content) == "APPROVAL_REQUIRED" and content["error"]["retryable"] is False
    (row,) = await db.approvals(database_url, run_id=run["id"])
    assert row.id == content["error"]["approval_id"]
    assert (row.status, row.requester_id, row.tool, row.tool_call_id) == ("pending", "bob", "create_article", "call_1")
    assert row.canonical_arguments == '{"body":"Up and to the right.","title":"Quarterly numbers"}'
    assert await db.articles(database_url, title=NEW_ARTICLE["title"]) == []


async def test_resending_the_same_call_returns_the_same_approval(client, database_url, pending):
    run_id, approval_id = pending
    for _ in range(2):
        content = await resend(client, run_id)
        assert outcome(content) == "APPROVAL_REQUIRED" and content["error"]["approval_id"] == approval_id
    assert len(await db.approvals(database_url, run_id=run_id)) == 1


async def test_a_new_call_id_with_the_same_arguments_is_a_new_approval(client, database_url, pending):
    run_id, approval_id = pending
    other = await request_approval(client, run_id, BOB, "call_2", "create_article", NEW_ARTICLE)
    assert other != approval_id
    assert len(await db.approvals(database_url, run_id=run_id)) == 2


async def test_the_requester_reads_the_pending_approval(client, pending):
    _, approval_id = pending
    response = await client.get(f"/v1/approvals/{approval_id}", headers=BOB)
    assert response.status_code == 200
    view = response.json()
    assert (view["status"], view["requested_by"], view["tool"], view["outcome"]) == ("pending", "bob", "create_article", None)
    assert view["arguments"] == NEW_ARTICLE


async def test_another_member_of_the_tenant_cannot_read_the_approval(client, pending):
    _, approval_id = pending
    assert_error(await client.get(f"/v1/approvals/{approval_id}", headers=ALICE), 404, "NOT_FOUND")


async def test_an_approver_can_read_the_approval(client, pending):
    _, approval_id = pending
    assert (await client.get(f"/v1/approvals/{approval_id}", headers=CAROL)).status_code == 200


# --- listing -----------------------------------------------------------------------------


async def test_an_approver_lists_pending_approvals(client, pending):
    _, approval_id = pending
    response = await client.get("/v1/admin/approvals", params={"status": "pending"}, headers=CAROL)
    assert response.status_code == 200
    assert [item["id"] for item in response.json()["items"]] == [approval_id]


@pytest.mark.parametrize("user", ["alice", "bob"])
async def test_listing_needs_approvals_decide(client, pending, user):
    response = await client.get("/v1/admin/approvals", params={"status": "pending"}, headers=auth_for(user))
    assert_error(response, 403, "FORBIDDEN")


async def test_another_tenants_approvals_are_not_listed(client, pending):
    response = await client.get("/v1/admin/approvals", headers=auth_for("carol", tenant="globex"))
    assert response.status_code == 200 and response.json()["items"] == []


async def test_decided_approvals_leave_the_pending_list(client, pending):
    _, approval_id = pending
    await approve(client, approval_id)
    pending_now = (await client.get("/v1/admin/approvals", params={"status": "pending"}, headers=CAROL)).json()
    succeeded = (await client.get("/v1/admin/approvals", params={"status": "succeeded"}, headers=CAROL)).json()
    assert pending_now["items"] == [] and [i["id"] for i in succeeded["items"]] == [approval_id]


async def test_the_list_is_paginated_newest_first(client):
    run = await create_run(client, BOB)
    ids = [
        await request_approval(client, run["id"], BOB, f"call_{i}", "create_article", {"title": f"T{i}", "body": "b"})
        for i in range(3)
    ]
    seen, cursor = [], None
    for _ in range(3):
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/admin/approvals", params=params, headers=CAROL)).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 3


@pytest.mark.parametrize("params", [{"status": "bogus"}, {"cursor": "not-a-cursor"}, {"limit": 0}])
async def test_invalid_list_parameters_are_invalid_request(client, params):
    assert_error(await client.get("/v1/admin/approvals", params=params, headers=CAROL), 400, "INVALID_REQUEST")


# --- approving ---------------------------------------------------------------------------


async def test_approving_executes_the_call_as_the_requester_and_records_the_approver(client, database_url, pending):
    run_id, approval_id = pending
    response = await approve(client, approval_id)
    assert response.status_code == 200
    view = response.json()
    assert (view["status"], view["decided_by"], view["requested_by"]) == ("succeeded", "carol", "bob")
    assert view["outcome"]["code"] == "OK" and view["outcome"]["ok"] is True
    (article,) = await db.articles(database_url, title=NEW_ARTICLE["title"])
    assert (article.author_id, article.tenant_id) == ("bob", "acme")
    assert view["outcome"]["result"]["id"] == article.id


async def test_after_execution_resending_the_call_returns_the_stored_result(client, pending):
    run_id, approval_id = pending
    view = (await approve(client, approval_id)).json()
    content = await resend(client, run_id)
    assert content["ok"] is True and content["result"] == view["outcome"]["result"]


async def test_the_frozen_call_executes_exactly_once(client, probe):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "call_1", "write_note", {"text": "hello"})
    assert (await approve(client, approval_id)).status_code == 200
    for _ in range(2):
        content = await send_one(client, run["id"], BOB, "call_1", "write_note", {"text": "hello"})
        assert content == {"ok": True, "result": {"written": "hello"}}
    assert_error(await approve(client, approval_id), 409, "ALREADY_DECIDED")
    assert probe.executions == {"call_1": 1}
    assert probe.callers == [("acme", "bob", idempotency_key_for("acme", approval_id))]


async def test_approving_twice_is_already_decided(client, database_url, pending):
    _, approval_id = pending
    assert (await approve(client, approval_id)).status_code == 200
    assert_error(await approve(client, approval_id), 409, "ALREADY_DECIDED")
    assert len(await db.articles(database_url, title=NEW_ARTICLE["title"])) == 1


async def test_rejecting_after_approving_is_already_decided(client, pending):
    _, approval_id = pending
    await approve(client, approval_id)
    assert_error(await reject(client, approval_id, "too late"), 409, "ALREADY_DECIDED")


async def test_approving_after_rejecting_is_already_decided(client, database_url, pending):
    _, approval_id = pending
    await reject(client, approval_id, "no")
    assert_error(await approve(client, approval_id), 409, "ALREADY_DECIDED")
    assert await db.articles(database_url, title=NEW_ARTICLE["title"]) == []


async def test_approving_ones_own_request_is_forbidden_by_default(client, database_url):
    run = await create_run(client, CAROL)
    approval_id = await request_approval(client, run["id"], CAROL, "call_1", "create_article", NEW_ARTICLE)
    assert_error(await approve(client, approval_id), 403, "SELF_APPROVAL_FORBIDDEN")
    (row,) = await db.approvals(database_url, id=approval_id)
    assert row.status == "pending"
    assert await db.articles(database_url, title=NEW_ARTICLE["title"]) == []


@pytest.mark.parametrize("settings_overrides", [{"allow_self_approval": True}])
async def test_self_approval_can_be_allowed(client, database_url):
    run = await create_run(client, CAROL)
    approval_id = await request_approval(client, run["id"], CAROL, "call_1", "create_article", NEW_ARTICLE)
    assert (await approve(client, approval_id)).status_code == 200
    assert len(await db.articles(database_url, title=NEW_ARTICLE["title"])) == 1


@pytest.mark.parametrize("user", ["alice", "bob"])
async def test_approving_needs_approvals_decide(client, pending, user):
    _, approval_id = pending
    assert_error(await approve(client, approval_id, auth_for(user)), 403, "FORBIDDEN")
    assert_error(await reject(client, approval_id, "no", auth_for(user)), 403, "FORBIDDEN")


async def test_another_tenants_approval_is_not_found(client, database_url, pending):
    _, approval_id = pending
    globex_carol = auth_for("carol", tenant="globex")
    assert_error(await approve(client, approval_id, globex_carol), 404, "NOT_FOUND")
    assert_error(await reject(client, approval_id, "no", globex_carol), 404, "NOT_FOUND")
    assert_error(await client.get(f"/v1/approvals/{approval_id}", headers=globex_carol), 404, "NOT_FOUND")
    assert_error(await client.get(f"/v1/approvals/{approval_id}", headers=auth_for("bob", tenant="globex")), 404, "NOT_FOUND")
    (row,) = await db.approvals(database_url, id=approval_id)
    assert row.status == "pending"


async def test_an_unknown_approval_is_not_found(client):
    assert_error(await approve(client, "apr_nope"), 404, "NOT_FOUND")


async def test_a_failed_execution_is_stored_as_the_calls_outcome(client):
    run = await create_run(client, BOB)
    arguments = {"article_id": "art_missing"}
    approval_id = await request_approval(client, run["id"], BOB, "call_1", "delete_article", arguments)
    view = (await approve(client, approval_id)).json()
    assert view["status"] == "failed" and view["outcome"]["code"] == "NOT_FOUND"
    assert outcome(await send_one(client, run["id"], BOB, "call_1", "delete_article", arguments)) == "NOT_FOUND"


async def test_the_requester_reads_the_outcome_after_execution(client, pending):
    _, approval_id = pending
    await approve(client, approval_id)
    view = (await client.get(f"/v1/approvals/{approval_id}", headers=BOB)).json()
    assert view["status"] == "succeeded" and view["outcome"]["result"]["title"] == NEW_ARTICLE["title"]


# --- rejecting ---------------------------------------------------------------------------


async def test_rejecting_with_a_reason_makes_the_outcome_approval_rejected(client, database_url, pending):
    run_id, approval_id = pending
    response = await reject(client, approval_id, "Numbers are not final.")
    assert response.status_code == 200
    view = response.json()
    assert (view["status"], view["reason"], view["decided_by"]) == ("rejected", "Numbers are not final.", "carol")
    assert view["outcome"]["code"] == "APPROVAL_REJECTED"
    content = await resend(client, run_id)
    assert outcome(content) == "APPROVAL_REJECTED" and "Numbers are not final." in content["error"]["message"]
    assert await db.articles(database_url, title=NEW_ARTICLE["title"]) == []


async def test_rejecting_twice_is_already_decided(client, pending):
    _, approval_id = pending
    await reject(client, approval_id, "no")
    assert_error(await reject(client, approval_id, "still no"), 409, "ALREADY_DECIDED")


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "x" * 1001}, {"reason": "no", "extra": 1}])
async def test_a_rejection_needs_a_reason(client, pending, body):
    _, approval_id = pending
    response = await client.post(f"/v1/admin/approvals/{approval_id}/reject", json=body, headers=CAROL)
    assert_error(response, 400, "INVALID_REQUEST")


async def test_a_reason_with_a_nul_character_is_invalid_request_not_a_server_error(client, pending):
    _, approval_id = pending
    response = await reject(client, approval_id, "no\u0000way")
    assert_error(response, 400, "INVALID_REQUEST")
    assert (await reject(client, approval_id, "no way")).status_code == 200


# --- expiry ------------------------------------------------------------------------------


@pytest.mark.parametrize("settings_overrides", [{"approval_ttl_s": 120}])
async def test_a_pending_approval_expires_after_the_configured_ttl(client, pending):
    _, approval_id = pending
    view = (await client.get(f"/v1/approvals/{approval_id}", headers=BOB)).json()
    ttl = datetime.fromisoformat(view["expires_at"]) - datetime.fromisoformat(view["requested_at"])
    # Both instants are taken while admitting the call, a few milliseconds apart at most.
    assert timedelta(seconds=119) < ttl <= timedelta(seconds=121)


async def test_an_expired_approval_reads_as_expired_and_leaves_the_pending_list(client, database_url, pending):
    _, approval_id = pending
    await db.expire_approval(database_url, approval_id)
    assert (await client.get(f"/v1/approvals/{approval_id}", headers=BOB)).json()["status"] == "expired"
    listed = (await client.get("/v1/admin/approvals", params={"status": "pending"}, headers=CAROL)).json()
    assert listed["items"] == []
    expired = (await client.get("/v1/admin/approvals", params={"status": "expired"}, headers=CAROL)).json()
    assert [item["id"] for item in expired["items"]] == [approval_id]


async def test_resending_a_call_whose_approval_expired_is_approval_expired(client, database_url, pending):
    run_id, approval_id = pending
    await db.expire_approval(database_url, approval_id)
    content = await resend(client, run_id)
    assert outcome(content) == "APPROVAL_EXPIRED" and content["error"]["approval_id"] == approval_id


async def test_approving_an_expired_approval_is_approval_expired_and_runs_nothing(client, database_url, pending):
    run_id, approval_id = pending
    await db.expire_approval(database_url, approval_id)
    assert_error(await approve(client, approval_id), 409, "APPROVAL_EXPIRED")
    assert_error(await reject(client, approval_id, "late"), 409, "APPROVAL_EXPIRED")
    assert await db.articles(database_url, title=NEW_ARTICLE["title"]) == []
    assert outcome(await resend(client, run_id)) == "APPROVAL_EXPIRED"
    (row,) = await db.approvals(database_url, id=approval_id)
    assert row.status == "expired"


# --- what the approved execution may and may not do ---------------------------------------


async def test_a_requester_who_lost_the_permission_meanwhile_is_permission_denied(client, database_url, pending):
    run_id, approval_id = pending
    table = RolePermission.__table__
    await db.execute(
        database_url,
        sa.delete(table).where(table.c.tenant_id == "acme", table.c.role == "editor", table.c.permission == "articles:write"),
    )
    view = (await approve(client, approval_id)).json()
    assert (view["status"], view["outcome"]["code"]) == ("failed", "PERMISSION_DENIED")
    assert await db.articles(database_url, title=NEW_ARTICLE["title"]) == []


async def test_arguments_changed_after_the_request_are_never_executed(client, database_url, pending, logs):
    _, approval_id = pending
    table = Approval.__table__
    tampered = {"title": "Tampered", "body": "Not what was approved."}
    await db.execute(
        database_url, sa.update(table).where(table.c.id == approval_id).values(canonical_arguments=json.dumps(tampered))
    )
    view = (await approve(client, approval_id)).json()
    assert (view["status"], view["outcome"]["code"]) == ("failed", "TOOL_EXECUTION_FAILED")
    assert await db.articles(database_url, title="Tampered") == []
    (event,) = logs.named("approval_arguments_tampered")
    assert event["error_id"] == view["outcome"]["error"]["error_id"]


async def test_a_failing_approved_call_leaves_none_of_its_writes(client, database_url, probe):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "write_then_fail", {"text": "Half written"})
    view = (await approve(client, approval_id)).json()
    assert (view["status"], view["outcome"]["code"]) == ("failed", "TOOL_EXECUTION_FAILED")
    assert "failed after writing" not in json.dumps(view)
    assert probe.executions == {"c1": 1}
    assert await db.articles(database_url, title="Half written") == []


async def test_an_approved_call_over_its_timeout_is_cancelled_and_its_writes_undone(client, database_url, probe):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "slow_write", {"seconds": 30})
    view = (await approve(client, approval_id)).json()
    assert (view["status"], view["outcome"]["code"]) == ("failed", "TOOL_TIMEOUT")
    assert probe.cancelled == ["c1"]
    assert await db.articles(database_url, title="slow write") == []


async def test_sensitive_arguments_are_redacted_in_the_approval_view_but_executed_whole(client, database_url, probe):
    run = await create_run(client, BOB)
    arguments = {"name": "api", "secret": "sk-live-do-not-show"}
    approval_id = await request_approval(client, run["id"], BOB, "c1", "store_secret", arguments)
    listed = (await client.get("/v1/admin/approvals", headers=CAROL)).text
    view = (await approve(client, approval_id)).json()
    assert view["arguments"] == {"name": "api", "secret": "[REDACTED]"}
    assert "sk-live-do-not-show" not in listed + json.dumps(view)
    assert probe.executions == {"c1": 1}
    for row in await db.audit_rows(database_url, approval_id=approval_id):
        assert row.arguments == {"name": "api", "secret": "[REDACTED]"}


async def test_the_decision_is_audited_with_its_request_id(client, database_url, pending):
    _, approval_id = pending
    await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers={**CAROL, "X-Request-ID": "approve-42"})
    rows = await db.audit_rows(database_url, approval_id=approval_id, request_id="approve-42")
    assert {(r.kind, r.outcome) for r in rows} == {("approval_decision", "APPROVED"), ("tool_call", "OK")}
