"""An approver reads one approval with the exact arguments that will execute: the tool's
sensitive fields hidden by default, shown only on explicit request, and that request is
audited before anything is shown. PostgreSQL."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from tests.support import db
from tests.support.approvals import CAROL, approve, request_approval
from tests.support.approvals import reject as reject_call
from tests.support.calls import create_run
from tests.support.console import csrf_of
from tests.support.http import assert_error
from tests.support.tokens import auth_for, make_token

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")
SECRET = "sk-live-do-not-show"
ARGUMENTS = {"name": "api", "secret": SECRET}


@pytest.fixture
async def secret_approval(pg_client):
    run = await create_run(pg_client, BOB)
    return await request_approval(pg_client, run["id"], BOB, "s1", "store_secret", ARGUMENTS)


async def read(client, approval_id: str, headers=CAROL, **params):
    return await client.get(f"/v1/admin/approvals/{approval_id}", params=params, headers=headers)


async def reveals(url: str, approval_id: str) -> list:
    return await db.audit_rows(url, approval_id=approval_id, kind="approval_reveal")


async def test_an_approver_reads_the_approval_with_sensitive_fields_hidden(pg_client, seeded_pg_url, secret_approval):
    response = await read(pg_client, secret_approval)
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["arguments"] == {"name": "api", "secret": "[REDACTED]"}
    assert view["redacted_fields"] == ["secret"]
    assert (view["id"], view["status"], view["tool"], view["requested_by"]) == (
        secret_approval, "pending", "store_secret", "bob"
    )
    assert SECRET not in response.text
    assert await reveals(seeded_pg_url, secret_approval) == []


async def test_reveal_shows_the_whole_arguments_and_audits_who_saw_them(pg_client, seeded_pg_url, secret_approval):
    response = await pg_client.get(
        f"/v1/admin/approvals/{secret_approval}", params={"reveal": "true"}, headers={**CAROL, "X-Request-ID": "peek-1"}
    )
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["arguments"] == ARGUMENTS and view["redacted_fields"] == []
    assert "no-store" in response.headers["cache-control"]
    (row,) = await reveals(seeded_pg_url, secret_approval)
    assert (row.user_id, row.outcome, row.request_id, row.tool, row.tool_call_id) == (
        "carol", "REVEALED", "peek-1", "store_secret", "s1"
    )
    assert row.detail == {"requester": "bob", "fields": ["secret"]}
    assert row.arguments == {"name": "api", "secret": "[REDACTED]"}  # the audit never keeps the secret


async def test_every_reveal_is_audited(pg_client, seeded_pg_url, secret_approval):
    for _ in range(2):
        assert (await read(pg_client, secret_approval, reveal="true")).status_code == 200
    assert len(await reveals(seeded_pg_url, secret_approval)) == 2


async def test_other_views_never_show_the_secret(pg_client, secret_approval):
    listed = await pg_client.get("/v1/admin/approvals", headers=CAROL)
    own = await pg_client.get(f"/v1/approvals/{secret_approval}", headers=BOB)
    own_reveal = await pg_client.get(f"/v1/approvals/{secret_approval}", params={"reveal": "true"}, headers=BOB)
    decided = await approve(pg_client, secret_approval)
    # The tool answers with the secret it stored: its outcome hides it as the arguments do.
    assert decided.json()["outcome"]["result"] == {"stored": "api", "secret": "[REDACTED]"}
    listed_after = await pg_client.get("/v1/admin/approvals", headers=CAROL)
    own_after = await pg_client.get(f"/v1/approvals/{secret_approval}", headers=BOB)
    revealed = await read(pg_client, secret_approval, reveal="true")
    assert revealed.json()["outcome"]["result"] == {"stored": "api", "secret": SECRET}
    hashed = revealed.json()["arguments_sha256"]  # shown beside the whole arguments it hashes
    assert hashed == hashlib.sha256(msgspec.json.encode(ARGUMENTS, order="sorted")).hexdigest()
    for response in (listed, own, own_reveal, decided, listed_after, own_after):
        assert response.status_code == 200, response.text
        assert SECRET not in response.text
        assert hashed not in response.text  # beside a hidden value: its hash would test guesses of it
    assert listed.json()["items"][0]["redacted_fields"] == ["secret"]
    assert listed.json()["items"][0]["arguments_sha256"] is None


@pytest.mark.parametrize("user", ["alice", "bob"])
async def test_reading_and_revealing_need_approvals_decide(pg_client, seeded_pg_url, secret_approval, user):
    assert_error(await read(pg_client, secret_approval, auth_for(user)), 403, "FORBIDDEN")
    response = await read(pg_client, secret_approval, auth_for(user), reveal="true")
    assert_error(response, 403, "FORBIDDEN")
    assert SECRET not in response.text
    assert await reveals(seeded_pg_url, secret_approval) == []


async def test_another_tenants_approver_cannot_reveal(pg_client, seeded_pg_url, secret_approval):
    response = await read(pg_client, secret_approval, auth_for("carol", tenant="globex"), reveal="true")
    assert_error(response, 404, "NOT_FOUND")
    assert await reveals(seeded_pg_url, secret_approval) == []


async def test_a_malformed_reveal_flag_is_invalid_request(pg_client, seeded_pg_url, secret_approval):
    assert_error(await read(pg_client, secret_approval, reveal="please"), 400, "INVALID_REQUEST")
    assert await reveals(seeded_pg_url, secret_approval) == []


async def test_a_tool_without_sensitive_fields_hides_nothing(pg_client, seeded_pg_url):
    run = await create_run(pg_client, BOB)
    approval_id = await request_approval(pg_client, run["id"], BOB, "n1", "write_note", {"text": "plain"})
    view = (await read(pg_client, approval_id)).json()
    assert view["arguments"] == {"text": "plain"} and view["redacted_fields"] == []
    assert (await read(pg_client, approval_id, reveal="true")).json()["arguments"] == {"text": "plain"}
    (row,) = await reveals(seeded_pg_url, approval_id)
    assert row.detail == {"requester": "bob", "fields": []}


async def test_while_the_tool_is_unknown_every_field_is_hidden_and_stays_out_of_the_audit(
    pg_client, seeded_pg_url, secret_approval
):
    """An MCP server down, or a tools file changed: nothing says which fields are sensitive,
    so none is shown, hashed or audited whole until an approver reveals them (audited)."""
    import sqlalchemy as sa

    from gateway.db.models import Approval

    table = Approval.__table__
    await db.execute(seeded_pg_url, sa.update(table).where(table.c.id == secret_approval).values(tool="gone_tool"))
    response = await read(pg_client, secret_approval)
    view = response.json()
    assert view["arguments"] == {"name": "[REDACTED]", "secret": "[REDACTED]"}
    assert view["redacted_fields"] == ["name", "secret"] and view["arguments_sha256"] is None
    listed = await pg_client.get("/v1/admin/approvals", headers=CAROL)
    form = await pg_client.get("/console/sign-in")
    await pg_client.post("/console/sign-in", data={"csrf_token": csrf_of(form.text), "token": make_token("acme", "carol")})
    page = await pg_client.get(f"/console/approvals/{secret_approval}")
    assert page.status_code == 200 and "gone_tool" in page.text
    for text in (response.text, listed.text, page.text):
        assert SECRET not in text
    pg_client.cookies.clear()

    revealed = (await read(pg_client, secret_approval, reveal="true")).json()
    assert revealed["arguments"] == ARGUMENTS
    (row,) = await reveals(seeded_pg_url, secret_approval)
    assert row.detail == {"requester": "bob", "fields": ["name", "secret"]}

    decided = await reject_call(pg_client, secret_approval, "the tool is gone")
    assert decided.status_code == 200, decided.text
    for audited in await db.audit_rows(seeded_pg_url, approval_id=secret_approval):
        assert SECRET not in msgspec.json.encode(audited.arguments).decode()
