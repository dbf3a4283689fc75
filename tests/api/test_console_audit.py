"""The console's audit pages over HTTP: the API's filters and pages, its exports, and the
tenant's chain verification; only for users who may read the audit."""

from __future__ import annotations

import json

import pytest

from tests.support.approvals import request_approval
from tests.support.calls import create_run
from tests.support.console import csrf_of, sign_in
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")


@pytest.fixture(autouse=True)
def no_redirects(pg_client):
    pg_client.follow_redirects = False


@pytest.fixture
async def two_approvals(pg_client):
    run = await create_run(pg_client, BOB)
    first = await request_approval(pg_client, run["id"], BOB, "a1", "write_note", {"text": "one"})
    second = await request_approval(pg_client, run["id"], BOB, "a2", "write_note", {"text": "two"})
    await pg_client.post(f"/v1/admin/approvals/{first}/reject", json={"reason": "no"}, headers=auth_for("carol"))
    await pg_client.post(f"/v1/admin/approvals/{second}/reject", json={"reason": "no"}, headers=auth_for("carol"))
    return first, second


async def test_the_audit_page_filters_by_approval(pg_client, two_approvals):
    first, second = two_approvals
    await sign_in(pg_client)
    everything = await pg_client.get("/console/audit")
    assert everything.status_code == 200 and first in everything.text and second in everything.text
    only_first = await pg_client.get("/console/audit", params={"approval": first})
    assert only_first.status_code == 200 and first in only_first.text and second not in only_first.text


async def test_the_audit_page_pages_with_a_cursor(pg_client, two_approvals, monkeypatch):
    from gateway.console import audit

    monkeypatch.setattr(audit, "PAGE_SIZE", 1)
    await sign_in(pg_client)
    first_page = await pg_client.get("/console/audit", params={"outcome": "REJECTED"})
    assert 'rel="next"' in first_page.text
    import re

    (next_link,) = re.findall(r'href="([^"]+)" rel="next"', first_page.text)
    second_page = await pg_client.get(next_link.replace("&amp;", "&"))
    assert second_page.status_code == 200
    first, second = two_approvals
    assert (second in first_page.text) != (second in second_page.text)


async def test_exports_stream_the_filtered_rows_as_jsonl_and_csv(pg_client, two_approvals):
    first, _ = two_approvals
    await sign_in(pg_client)
    jsonl = await pg_client.get("/console/audit/export", params={"format": "jsonl", "approval": first})
    assert jsonl.status_code == 200 and "attachment" in jsonl.headers["content-disposition"]
    rows = [json.loads(line) for line in jsonl.text.splitlines()]
    assert rows and all(row["approval_id"] == first for row in rows)
    csv = await pg_client.get("/console/audit/export", params={"format": "csv", "approval": first})
    assert csv.status_code == 200 and csv.text.splitlines()[0].startswith("id,")
    bad = await pg_client.get("/console/audit/export", params={"format": "xml"})
    assert bad.status_code == 400


async def test_the_chain_verification_is_shown(pg_client, two_approvals):
    await sign_in(pg_client)
    response = await pg_client.get("/console/audit/verify")
    assert response.status_code == 200 and "tenant acme: OK" in response.text


async def test_a_bad_time_filter_is_explained_not_a_500(pg_client):
    await sign_in(pg_client)
    response = await pg_client.get("/console/audit", params={"since": "yesterday"})
    assert response.status_code == 400 and "since" in response.text
    nul = await pg_client.get("/console/audit", params={"user": "a\x00b"})
    assert nul.status_code == 400
    long = await pg_client.get("/console/audit", params={"tool": "t" * 5000})
    assert long.status_code == 400
    cursor = await pg_client.get("/console/audit", params={"cursor": "garbage"})
    assert cursor.status_code == 400


async def test_a_user_without_audit_read_gets_the_403_page(pg_client):
    await sign_in(pg_client, "bob")
    for path in ("/console/audit", "/console/audit/export", "/console/audit/verify"):
        response = await pg_client.get(path)
        assert response.status_code == 403 and "audit:read" in response.text, path


@pytest.mark.parametrize("settings_overrides", [{"rate_limit_user_rps": 0.01, "rate_limit_user_burst": 3}])
async def test_console_pages_spend_the_users_rate_as_the_api_does(pg_client):
    await sign_in(pg_client)  # the sign-in pages spend nothing: no one is signed in yet
    answers = [await pg_client.get("/console/audit/verify") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert "retry-after" in answers[-1].headers
    api = await pg_client.get("/v1/tools", headers=auth_for("carol"))
    assert api.status_code == 429  # the same user's tokens
    # Over the rate, a user can still sign out.
    out = await pg_client.post("/console/sign-out", data={"csrf_token": csrf_of(answers[0].text)})
    assert out.status_code == 303
    assert (await pg_client.get("/console/audit/verify")).status_code in (302, 303)  # signed out
