"""The console's pages over HTTP (the app behind the test client, PostgreSQL): sign-in,
what each page shows and to whom, decisions through the same service as the API."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.support import db
from tests.support.approvals import request_approval
from tests.support.calls import create_run
from tests.support.console import csrf_of, page_csrf, sign_in
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")
SECRET = "sk-live-do-not-show"


@pytest.fixture(autouse=True)
def no_redirects(pg_client):
    pg_client.follow_redirects = False


@pytest.fixture
async def pending(pg_client):
    run = await create_run(pg_client, BOB)
    return await request_approval(pg_client, run["id"], BOB, "s1", "store_secret", {"name": "api", "secret": SECRET})


async def test_a_page_without_a_session_redirects_to_sign_in(pg_client):
    response = await pg_client.get("/console/approvals")
    assert response.status_code == 303
    assert response.headers["location"] == "/console/sign-in"


async def test_token_sign_in_starts_a_session_with_a_strict_http_only_cookie(pg_client):
    response = await sign_in(pg_client)
    assert response.headers["location"] == "/console/approvals"
    cookie = next(value for name, value in response.headers.multi_items()
                  if name == "set-cookie" and value.startswith("gateway_console="))
    flags = cookie.lower()
    assert "httponly" in flags and "samesite=strict" in flags and "path=/console" in flags
    assert "secure" not in flags  # plain http here
    page = await pg_client.get("/console/approvals")
    assert page.status_code == 200 and "carol" in page.text


async def test_the_session_row_holds_a_hash_of_the_cookie_value_not_the_value(pg_client, seeded_pg_url):
    await sign_in(pg_client)
    value = pg_client.cookies.get("gateway_console")
    rows = await db.rows(seeded_pg_url, sa.text("SELECT id_hash, csrf_token FROM console_sessions"))
    assert len(rows) == 1 and rows[0].id_hash != value and len(rows[0].id_hash) == 64


async def test_a_bad_token_is_refused_and_not_echoed(pg_client):
    form = await pg_client.get("/console/sign-in")
    response = await pg_client.post(
        "/console/sign-in", data={"csrf_token": csrf_of(form.text), "token": "not.a.token-SECRETPART"}
    )
    assert response.status_code == 401
    assert "SECRETPART" not in response.text
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_pending_approval_is_listed_with_tool_requester_and_expiry(pg_client, pending):
    await sign_in(pg_client)
    page = await pg_client.get("/console/approvals")
    assert page.status_code == 200
    assert pending in page.text and "store_secret" in page.text and "bob" in page.text
    assert 'aria-label="1 pending"' in page.text


async def test_detail_hides_sensitive_fields_until_revealed_and_the_reveal_is_audited(
    pg_client, seeded_pg_url, pending
):
    await sign_in(pg_client)
    detail = await pg_client.get(f"/console/approvals/{pending}")
    assert detail.status_code == 200 and SECRET not in detail.text and "[REDACTED]" in detail.text
    revealed = await pg_client.post(f"/console/approvals/{pending}/reveal", data={"csrf_token": csrf_of(detail.text)})
    assert revealed.status_code == 200 and SECRET in revealed.text
    (row,) = await db.audit_rows(seeded_pg_url, approval_id=pending, kind="approval_reveal")
    assert row.user_id == "carol"
    assert row.arguments_sha256 in revealed.text and row.arguments_sha256 not in detail.text


async def test_approving_in_the_console_executes_and_audits_like_the_api(pg_client, seeded_pg_url, pending):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, f"/console/approvals/{pending}")
    response = await pg_client.post(f"/console/approvals/{pending}/approve", data={"csrf_token": csrf})
    assert response.status_code == 303
    view = (await pg_client.get(f"/v1/approvals/{pending}", headers=BOB)).json()
    assert view["status"] == "succeeded" and view["decided_by"] == "carol"
    decisions = await db.audit_rows(seeded_pg_url, approval_id=pending, kind="approval_decision")
    assert [(row.user_id, row.outcome) for row in decisions] == [("carol", "APPROVED")]


async def test_a_second_decision_shows_the_api_error_in_words(pg_client, pending):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, f"/console/approvals/{pending}")
    await pg_client.post(f"/console/approvals/{pending}/approve", data={"csrf_token": csrf})
    again = await pg_client.post(f"/console/approvals/{pending}/reject", data={"csrf_token": csrf, "reason": "late"})
    assert again.status_code == 409
    assert "This approval has already been decided." in again.text


async def test_self_approval_is_refused_in_words(pg_client):
    carol = auth_for("carol")
    run = await create_run(pg_client, carol)
    approval = await request_approval(pg_client, run["id"], carol, "c1", "store_secret", {"name": "x", "secret": "y"})
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, f"/console/approvals/{approval}")
    response = await pg_client.post(f"/console/approvals/{approval}/approve", data={"csrf_token": csrf})
    assert response.status_code == 403
    assert "own" in response.text.lower()


async def test_rejecting_needs_a_reason_and_records_it(pg_client, pending):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, f"/console/approvals/{pending}")
    empty = await pg_client.post(f"/console/approvals/{pending}/reject", data={"csrf_token": csrf, "reason": "  "})
    assert empty.status_code == 400
    done = await pg_client.post(f"/console/approvals/{pending}/reject", data={"csrf_token": csrf, "reason": "too risky"})
    assert done.status_code == 303
    view = (await pg_client.get(f"/v1/approvals/{pending}", headers=BOB)).json()
    assert view["status"] == "rejected" and view["reason"] == "too risky"


async def test_a_member_gets_a_403_page_not_an_empty_list(pg_client, pending):
    await sign_in(pg_client, "alice")
    response = await pg_client.get("/console/approvals")
    assert response.status_code == 403
    assert "approvals:decide" in response.text and pending not in response.text


async def test_another_tenants_approval_is_a_404_page(pg_client, pending):
    await sign_in(pg_client, "carol", tenant="globex")
    response = await pg_client.get(f"/console/approvals/{pending}")
    assert response.status_code == 404 and "text/html" in response.headers["content-type"]
