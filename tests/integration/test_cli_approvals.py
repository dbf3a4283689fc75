"""`gateway approvals list|show|approve|reject` as an operator runs it, in a separate process,
against the database the app serves: the API's rules, codes and audit rows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gateway.db.models import Tenant
from gateway.execution.approvals import idempotency_key_for
from tests.integration.http_env import Caller, HttpEnv, http_env
from tests.support import db
from tests.support.approvals import request_approval
from tests.support.calls import new_run
from tests.support.processes import ROOT, gateway_env
from tests.support.tokens import auth_for

ARTICLE = {"title": "From the terminal", "body": "Decided by a second approver."}


def approvals(database_url: str, *args: str | bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "approvals", *args],
        cwd=ROOT, env=gateway_env(database_url, log_level="WARNING"), input=stdin, capture_output=True, timeout=60,
    )
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    return subprocess.CompletedProcess(done.args, done.returncode, out, err)


async def pending_from(client: Any, user: str, call_id: str = "c1") -> str:
    run_id = await new_run(client, user)
    return await request_approval(client, run_id, auth_for(user), call_id, "create_article", ARTICLE)


async def test_list_and_show_print_the_pending_approval_for_people_and_scripts(client, database_url):
    approval_id = await pending_from(client, "bob")
    listed = approvals(database_url, "list", "--tenant", "acme", "--as", "dave")
    assert listed.returncode == 0, listed.stderr
    (line,) = [line for line in listed.stdout.splitlines() if approval_id in line]
    assert "pending" in line and "create_article" in line and "requested by bob" in line
    as_json = approvals(database_url, "list", "--tenant", "acme", "--as", "dave", "--status", "pending", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert [item["id"] for item in json.loads(as_json.stdout)["items"]] == [approval_id]
    shown = approvals(database_url, "show", approval_id, "--tenant", "acme", "--as", "dave", "--json")
    assert shown.returncode == 0, shown.stderr
    api = (await client.get(f"/v1/admin/approvals/{approval_id}", headers=auth_for("dave"))).json()
    view = json.loads(shown.stdout)
    assert {k: view[k] for k in ("id", "status", "tool", "arguments", "requested_by", "run_id")} == {
        k: api[k] for k in ("id", "status", "tool", "arguments", "requested_by", "run_id")
    }
    human = approvals(database_url, "show", approval_id, "--tenant", "acme", "--as", "dave", "--reveal")
    assert "status     pending" in human.stdout and '"title":"From the terminal"' in human.stdout
    (revealed,) = await db.audit_rows(database_url, approval_id=approval_id, kind="approval_reveal")
    assert revealed.user_id == "dave"


async def test_approve_refuses_a_tool_the_command_cannot_run_and_leaves_the_approval_pending(client, database_url):
    """The command loads the built-in and HTTP tools, not the MCP servers' tools of a running
    gateway: approving such a call here would spend it on TOOL_NOT_FOUND."""
    from gateway.db.models import Approval

    approval_id = await pending_from(client, "bob")
    table = Approval.__table__
    await db.execute(database_url, sa.update(table).where(table.c.id == approval_id).values(tool="payments__pay"))
    done = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "dave")
    assert done.returncode == 1
    assert "TOOL_NOT_FOUND" in done.stderr and "console or through the API" in done.stderr
    (row,) = await db.approvals(database_url, id=approval_id)
    assert row.status == "pending"
    assert await db.audit_rows(database_url, approval_id=approval_id, kind="approval_decision") == []
    shown = approvals(database_url, "show", approval_id, "--tenant", "acme", "--as", "dave", "--json")
    assert json.loads(shown.stdout)["arguments"] == {"title": "[REDACTED]", "body": "[REDACTED]"}


async def test_approve_as_the_second_approver_runs_the_call_once_with_the_apis_audit_rows(client, database_url):
    approval_id = await pending_from(client, "bob")
    done = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "dave")
    assert done.returncode == 0, done.stderr
    assert f"approved {approval_id}: create_article ran as bob and succeeded" in done.stdout
    assert "outcome    OK" in done.stdout
    assert len(await db.articles(database_url, title=ARTICLE["title"])) == 1
    (decision,) = await db.audit_rows(database_url, approval_id=approval_id, kind="approval_decision")
    assert (decision.user_id, decision.outcome) == ("dave", "APPROVED") and decision.request_id.startswith("req_")
    (executed,) = await db.audit_rows(database_url, approval_id=approval_id, kind="tool_call", outcome="OK")
    assert executed.user_id == "bob" and executed.detail["approved_by"] == "dave"

    again = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "dave", "--json")
    assert again.returncode == 1
    assert "ALREADY_DECIDED" in again.stderr and json.loads(again.stdout)["error"]["code"] == "ALREADY_DECIDED"
    assert len(await db.articles(database_url, title=ARTICLE["title"])) == 1
    # The API answers the same decision with the same code.
    api = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert api.status_code == 409 and api.json()["error"]["code"] == "ALREADY_DECIDED"


async def test_an_approver_cannot_approve_their_own_request_and_the_second_approver_can(client, database_url):
    approval_id = await pending_from(client, "carol")
    own = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "carol")
    assert own.returncode == 1 and "SELF_APPROVAL_FORBIDDEN" in own.stderr
    assert (await db.approvals(database_url, id=approval_id))[0].status == "pending"
    other = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "dave")
    assert other.returncode == 0, other.stderr


async def test_reject_stores_the_reason_and_a_second_decision_is_refused(client, database_url):
    approval_id = await pending_from(client, "bob")
    done = approvals(database_url, "reject", approval_id, "--reason", "not this week", "--tenant", "acme",
                     "--as", "dave", "--json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "rejected" and view["reason"] == "not this week"
    assert view["outcome"]["code"] == "APPROVAL_REJECTED" and view["decided_by"] == "dave"
    (decision,) = await db.audit_rows(database_url, approval_id=approval_id, kind="approval_decision")
    assert decision.outcome == "REJECTED" and decision.detail["reason"] == "not this week"
    again = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "dave")
    assert again.returncode == 1 and "ALREADY_DECIDED" in again.stderr
    assert await db.articles(database_url, title=ARTICLE["title"]) == []


async def test_a_member_and_an_unknown_user_are_refused(client, database_url):
    approval_id = await pending_from(client, "bob")
    for action in (["list"], ["approve", approval_id], ["reject", approval_id, "--reason", "no"]):
        member = approvals(database_url, *action, "--tenant", "acme", "--as", "alice")
        assert member.returncode == 1 and "FORBIDDEN" in member.stderr, action
    stranger = approvals(database_url, "list", "--tenant", "acme", "--as", "mallory")
    assert stranger.returncode == 1 and "UNAUTHENTICATED" in stranger.stderr
    nowhere = approvals(database_url, "list", "--tenant", "initech", "--as", "dave")
    assert nowhere.returncode == 1 and "UNAUTHENTICATED" in nowhere.stderr
    await db.execute(database_url, sa.update(Tenant.__table__).where(Tenant.__table__.c.id == "acme")
                     .values(disabled=True))
    disabled = approvals(database_url, "approve", approval_id, "--tenant", "acme", "--as", "dave")
    assert disabled.returncode == 1 and "TENANT_DISABLED" in disabled.stderr
    assert (await db.approvals(database_url, id=approval_id))[0].status == "pending"


async def test_another_tenants_approval_is_not_found(client, database_url):
    approval_id = await pending_from(client, "bob")
    for action in (["show", approval_id], ["approve", approval_id], ["reject", approval_id, "--reason", "x"]):
        done = approvals(database_url, *action, "--tenant", "globex", "--as", "dave")
        assert done.returncode == 1 and "NOT_FOUND" in done.stderr, action
    assert (await db.approvals(database_url, id=approval_id))[0].status == "pending"
    globex = approvals(database_url, "list", "--tenant", "globex", "--as", "dave", "--json")
    assert json.loads(globex.stdout)["items"] == []


async def test_hostile_input_is_a_usage_error_and_decides_nothing(client, database_url):
    approval_id = await pending_from(client, "bob")
    who = ("--tenant", "acme", "--as", "dave")
    cases: list[tuple[list[str | bytes], bytes | None]] = [
        (["reject", approval_id, "--reason", "-", *who], b"no\x00pe"),
        (["reject", approval_id, "--reason", "-", *who], b"x" * 200_000),
        (["reject", approval_id, "--reason", "x" * 1001, *who], None),
        (["reject", approval_id, "--reason", b"bad \xff utf-8", *who], None),
        (["reject", approval_id, "--reason", "", *who], None),
        (["approve", "../" + approval_id, *who], None),
        (["approve", "a" * 65, *who], None),
        (["approve", approval_id + "\n", *who], None),
        (["approve", "apr_\u00fc", *who], None),
        (["show", "", *who], None),
        (["approve", approval_id, "--tenant", "acme", "--as", b"da\xffve"], None),
        (["approve", approval_id, "--tenant", "x" * 65, "--as", "dave"], None),
        (["list", "--limit", "0", *who], None),
    ]
    for args, stdin in cases:
        done = approvals(database_url, *args, stdin=stdin)
        assert done.returncode == 2, (args[:2], done.stderr)
        assert "INVALID_REQUEST" in done.stderr, (args[:2], done.stderr)
    missing = approvals(database_url, "approve", approval_id, "--tenant", "acme")
    assert missing.returncode == 2 and "--as" in missing.stderr
    assert (await db.approvals(database_url, id=approval_id))[0].status == "pending"


async def test_a_reason_with_terminal_controls_is_stored_whole_and_shown_escaped(client, database_url):
    approval_id = await pending_from(client, "bob")
    reason = "no\x1b[2J\u2028forged line"
    done = approvals(database_url, "reject", approval_id, "--reason", "-", "--tenant", "acme", "--as", "dave",
                     stdin=reason.encode())
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\u2028" not in done.stdout and "\\u001b[2J" in done.stdout
    assert (await db.approvals(database_url, id=approval_id))[0].reason == reason


async def test_a_tool_call_id_with_terminal_controls_is_shown_escaped(client, database_url):
    approval_id = await pending_from(client, "bob", call_id="c1\x1b[2J\u2028forged line")
    shown = approvals(database_url, "show", approval_id, "--tenant", "acme", "--as", "dave")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\u2028" not in shown.stdout and "\\u001b[2J" in shown.stdout


@pytest.fixture
def services_env(request: pytest.FixtureRequest) -> Iterator[HttpEnv]:
    yield from http_env(request)


async def test_approving_an_http_tools_call_from_the_terminal_calls_its_service_once_as_the_requester(
    services_env: HttpEnv,
):
    """The command builds the tools as `gateway serve` does: the approved call reaches the
    business service with the requester's token and the approval's idempotency key."""
    env = services_env
    async with httpx.AsyncClient(base_url=env.gateway_url, timeout=30) as client:
        asked = await Caller(client).call("create_order", {"item": "lamp", "quantity": 2}, user="bob")
    approval_id = asked["error"]["approval_id"]
    changes = env.service.applied_changes
    services = env.settings.services
    settings = {"tools_file": env.settings.tools.file, "service_base_urls": ",".join(services.base_urls),
                "service_signing_key": services.signing_key}
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "approvals", "approve", approval_id, "--tenant", "acme", "--as", "dave",
         "--json"],
        cwd=ROOT, env=gateway_env(env.settings.database.url, log_level="WARNING", **settings),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "succeeded" and view["outcome"]["result"]["owner"] == "bob"
    assert env.service.applied_changes == changes + 1
    arrived = next(r for r in reversed(env.service.seen) if r.raw_path == "/api/orders")
    assert arrived.headers["idempotency-key"] == idempotency_key_for("acme", approval_id)
    (claims,) = [c for c in env.service.claims if c["tool_call_id"] == asked["_call_id"]]
    assert claims["sub"] == "bob"
