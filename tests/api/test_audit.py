"""The audit: every attempt, decision and refusal is appended with who, what, outcome and
request; sensitive arguments are redacted; nothing ever changes a row once written."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from gateway.audit.sealer import AuditSealer
from tests.support import db
from tests.support.approvals import CAROL, approve, reject, request_approval
from tests.support.calls import batch, create_run, send, send_one, tool_call
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")
REQUEST_ID = "audit-req-0001"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_every_attempt_of_a_batch_is_recorded_with_its_context(client, database_url):
    run = await create_run(client, BOB, max_tool_calls=4, max_repeats=1)
    calls = [
        tool_call("add", raw='{"b": 2, "a": 1}', call_id="ok"),
        tool_call("no_such_tool", {}, call_id="missing"),
        tool_call("add", raw='{"a": "1"}', call_id="invalid"),
        tool_call("divide", {"a": 1, "b": 0}, call_id="rule"),
        tool_call("add", {"a": 1, "b": 2}, call_id="repeat"),
        tool_call("create_article", {"title": "T", "body": "B"}, call_id="approval"),
        tool_call("multiply", {"a": 1, "b": 1}, call_id="budget"),
    ]
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", json=batch(*calls), headers={**BOB, "X-Request-ID": REQUEST_ID}
    )
    assert response.status_code == 200
    rows = {r.tool_call_id: r for r in await db.audit_rows(database_url, run_id=run["id"])}
    assert {k: rows[k].outcome for k in rows} == {
        "ok": "OK", "missing": "TOOL_NOT_FOUND", "invalid": "INVALID_ARGUMENTS", "rule": "BUSINESS_RULE_VIOLATION",
        "repeat": "REPEATED_CALL", "approval": "APPROVAL_REQUIRED", "budget": "BUDGET_EXCEEDED",
    }
    for call_id, row in rows.items():
        assert (row.tenant_id, row.user_id, row.run_id, row.request_id) == ("acme", "bob", run["id"], REQUEST_ID)
        assert row.kind == "tool_call" and row.created_at is not None
        assert row.tool == next(c["function"]["name"] for c in calls if c["id"] == call_id)
    ok = rows["ok"]
    assert ok.arguments == {"a": 1, "b": 2} and ok.arguments_sha256 == sha(b'{"a":1,"b":2}')
    assert ok.duration_ms is not None and ok.duration_ms >= 0 and ok.approval_id is None
    assert rows["rule"].duration_ms is not None
    assert rows["invalid"].arguments is None and rows["invalid"].arguments_sha256 == sha(b'{"a": "1"}')
    (approval,) = await db.approvals(database_url, run_id=run["id"])
    assert rows["approval"].approval_id == approval.id
    assert rows["approval"].arguments == {"title": "T", "body": "B"}


async def test_sensitive_arguments_are_redacted_in_the_audit(client, database_url, logs):
    run = await create_run(client, BOB)
    arguments = {"username": "bob", "password": "correct horse battery", "vault": "backup"}
    assert (await send_one(client, run["id"], BOB, "c1", "login", arguments))["ok"] is True
    (row,) = await db.audit_rows(database_url, run_id=run["id"])
    assert row.arguments == {"username": "bob", "password": "[REDACTED]", "vault": "[REDACTED]"}
    canonical = b'{"password":"correct horse battery","username":"bob","vault":"backup"}'
    assert row.arguments_sha256 == sha(canonical)
    assert "correct horse battery" not in logs.text


async def test_a_reader_is_shown_an_arguments_hash_only_beside_the_whole_arguments_it_hashes(client, database_url):
    # A hash of a redacted PIN is a PIN anyone can find by trying the 10,000 of them against it.
    run = await create_run(client, BOB)
    await send_one(client, run["id"], BOB, "pin", "login", {"username": "bob", "password": "4711", "vault": "main"})
    await send_one(client, run["id"], BOB, "plain", "add", {"a": 1, "b": 2})
    await send(client, run["id"], BOB, tool_call("login", raw='{"username": "bob", "password": 4711}', call_id="refused"))
    await send_one(client, run["id"], BOB, "pin", "add", {"a": 1, "b": 3})  # the id of another call: a conflict
    listed = await client.get("/v1/admin/audit/", params={"run": run["id"]}, headers=CAROL)
    assert listed.status_code == 200, listed.text
    shown = {(item["tool_call_id"], item["kind"]): item["arguments_sha256"] for item in listed.json()["items"]}
    assert shown == {("pin", "tool_call"): None, ("plain", "tool_call"): sha(b'{"a":1,"b":2}'),
                     ("refused", "tool_call"): None, ("pin", "tool_call_conflict"): sha(b'{"a":1,"b":3}')}
    conflict = next(item for item in listed.json()["items"] if item["kind"] == "tool_call_conflict")
    assert conflict["detail"] == {"stored_tool": "login"}  # not the stored call's hash

    # Sealed, no chain hash is shown: each covers the hidden ones before it, and would test
    # guesses as well (content, then chain hash, row after row).
    async with db.open_database(database_url) as database:
        await AuditSealer(database).seal_pending()
    items = (await client.get("/v1/admin/audit/", params={"run": run["id"]}, headers=CAROL)).json()["items"]
    assert all(item["chain_seq"] is not None and item["hash_version"] == 2 for item in items)
    assert {(item["content_hash"], item["prev_hash"], item["chain_hash"]) for item in items} == {(None, None, None)}
    for fmt in ("jsonl", "csv"):
        exported = await client.get("/v1/admin/audit/export", params={"run": run["id"], "format": fmt}, headers=CAROL)
        assert exported.status_code == 200
        assert sha(b'{"a":1,"b":2}') in exported.text
        for row in await db.audit_rows(database_url, run_id=run["id"]):
            if row.tool == "login":
                assert row.arguments_sha256 not in exported.text  # kept in the row: the chain covers it


async def test_a_replay_is_recorded_as_an_attempt(client, database_url):
    run = await create_run(client, BOB)
    await send_one(client, run["id"], BOB, "c1", "add", {"a": 1, "b": 1})
    await send_one(client, run["id"], BOB, "c1", "add", {"a": 1, "b": 1})
    rows = await db.audit_rows(database_url, run_id=run["id"])
    assert [(r.kind, r.outcome) for r in rows] == [("tool_call", "OK"), ("tool_call_replay", "OK")]


async def test_a_protocol_rejection_is_recorded(client, database_url):
    run = await create_run(client, BOB)
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": []}, headers={**BOB, "X-Request-ID": REQUEST_ID}
    )
    assert response.status_code == 422
    (row,) = await db.audit_rows(database_url, run_id=run["id"])
    assert (row.kind, row.outcome, row.user_id, row.request_id) == ("protocol_rejection", "INVALID_TOOL_CALL", "bob", REQUEST_ID)


async def test_an_approval_and_its_execution_are_recorded_with_both_people(client, database_url):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "create_article", {"title": "T", "body": "B"})
    await approve(client, approval_id)
    rows = await db.audit_rows(database_url, approval_id=approval_id)
    assert [(r.kind, r.user_id, r.outcome) for r in rows] == [
        ("tool_call", "bob", "APPROVAL_REQUIRED"),
        ("approval_decision", "carol", "APPROVED"),
        ("tool_call", "bob", "OK"),
    ]
    executed = rows[-1]
    assert executed.detail == {"approved_by": "carol"}
    assert executed.arguments_sha256 == rows[0].arguments_sha256
    assert executed.duration_ms is not None


async def test_a_rejection_is_recorded_with_its_reason(client, database_url):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "create_article", {"title": "T", "body": "B"})
    await reject(client, approval_id, "Not now.")
    decision = (await db.audit_rows(database_url, approval_id=approval_id, kind="approval_decision"))[0]
    assert (decision.user_id, decision.outcome) == ("carol", "REJECTED")
    assert decision.detail == {"requester": "bob", "reason": "Not now."}


async def test_refused_decisions_are_recorded(client, database_url):
    run = await create_run(client, CAROL)
    approval_id = await request_approval(client, run["id"], CAROL, "c1", "create_article", {"title": "T", "body": "B"})
    await approve(client, approval_id)  # her own: refused
    decisions = await db.audit_rows(database_url, approval_id=approval_id, kind="approval_decision")
    assert [d.outcome for d in decisions] == ["SELF_APPROVAL_FORBIDDEN"]


async def test_rows_once_written_never_change(client, database_url):
    run = await create_run(client, BOB, max_tool_calls=5)
    await send_one(client, run["id"], BOB, "c1", "add", {"a": 1, "b": 1})
    approval_id = await request_approval(client, run["id"], BOB, "c2", "create_article", {"title": "T", "body": "B"})
    other = await request_approval(client, run["id"], BOB, "c3", "delete_article", {"article_id": "art_demo_acme_2"})
    before = [tuple(r) for r in await db.audit_rows(database_url)]
    # Everything that moves state afterwards: replays, decisions, refusals, expiry.
    await send_one(client, run["id"], BOB, "c1", "add", {"a": 1, "b": 1})
    await approve(client, approval_id)
    await approve(client, approval_id)
    await db.expire_approval(database_url, other)
    await reject(client, other, "late")
    await send_one(client, run["id"], BOB, "c3", "delete_article", {"article_id": "art_demo_acme_2"})
    after = [tuple(r) for r in await db.audit_rows(database_url)]
    assert after[: len(before)] == before
    assert len(after) > len(before)


# The places allowed to touch existing rows, none reachable through the API: the sealer (it
# links rows, and writes the chain's links), the operator's retention command (it drops old
# months behind the anchors it moves), and the partition maintenance (it moves rows out of
# the default partition into the month made for them).
CHAIN_MAINTENANCE = {"gateway/audit/sealer.py", "gateway/audit/prune.py", "gateway/db/sql/audit_partitions.sql"}


def test_no_code_updates_or_deletes_audit_rows():
    root = Path(__file__).resolve().parents[2]
    sources = [
        path
        for path in [
            *root.joinpath("gateway").rglob("*.py"),
            *root.joinpath("gateway").rglob("*.sql"),
            *root.joinpath("migrations").rglob("*.py"),
        ]
        if str(path.relative_to(root)) not in CHAIN_MAINTENANCE
    ]
    forbidden = re.compile(
        r"(UPDATE\s+audit_events|DELETE\s+FROM\s+audit_events|TRUNCATE\s+audit_events"
        r"|update\(\s*(_audit|audit|audit_events|AuditEvent)\b|delete\(\s*(_audit|audit|audit_events|AuditEvent)\b)",
        re.IGNORECASE,
    )
    offenders = [str(path.relative_to(root)) for path in sources if forbidden.search(path.read_text())]
    assert offenders == []
