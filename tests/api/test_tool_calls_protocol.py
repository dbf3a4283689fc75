"""A batch that breaks the protocol is refused whole (422), before anything runs, and audited."""

from __future__ import annotations

import json

import pytest

from tests.support import db
from tests.support.calls import create_run, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")


def good_calls() -> list[dict]:
    """Calls that would each do something if the batch ran: execute, or create an approval."""
    return [
        tool_call("count", {}, call_id="ok_1"),
        tool_call("create_article", {"title": "Launch", "body": "Soon."}, call_id="ok_2"),
    ]


BROKEN_CALLS = {
    "missing-id": ({"type": "function", "function": {"name": "add", "arguments": "{}"}}, "INVALID_TOOL_CALL"),
    "empty-id": ({"id": "", "type": "function", "function": {"name": "add", "arguments": "{}"}}, "INVALID_TOOL_CALL"),
    "type-not-function": ({"id": "b", "type": "tool", "function": {"name": "add", "arguments": "{}"}}, "INVALID_TOOL_CALL"),
    "missing-type": ({"id": "b", "function": {"name": "add", "arguments": "{}"}}, "INVALID_TOOL_CALL"),
    "empty-name": ({"id": "b", "type": "function", "function": {"name": "", "arguments": "{}"}}, "INVALID_TOOL_CALL"),
    "missing-arguments": ({"id": "b", "type": "function", "function": {"name": "add"}}, "INVALID_TOOL_CALL"),
    "missing-function": ({"id": "b", "type": "function"}, "INVALID_TOOL_CALL"),
    "duplicate-id": (tool_call("add", {"a": 1, "b": 2}, call_id="ok_1"), "DUPLICATE_TOOL_CALL_ID"),
}


async def assert_nothing_ran(client, database_url, probe, run_id: str) -> None:
    assert probe.executions == {}
    assert await db.approvals(database_url, run_id=run_id) == []
    assert await db.tool_call_rows(database_url, run_id) == []
    assert (await client.get(f"/v1/runs/{run_id}", headers=BOB)).json()["usage"]["tool_calls"] == 0


async def assert_rejection_audited(database_url, run_id: str, code: str) -> None:
    (row,) = await db.audit_rows(database_url, run_id=run_id)
    assert (row.kind, row.outcome, row.tenant_id, row.user_id) == ("protocol_rejection", code, "acme", "bob")
    assert row.request_id


@pytest.mark.parametrize("broken", BROKEN_CALLS, ids=list(BROKEN_CALLS))
async def test_a_broken_call_rejects_the_whole_batch_before_anything_runs(client, database_url, probe, broken):
    bad_call, code = BROKEN_CALLS[broken]
    run = await create_run(client, BOB)
    body = {"tool_calls": [*good_calls(), bad_call]}
    response = await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB)
    assert_error(response, 422, code)
    await assert_nothing_ran(client, database_url, probe, run["id"])
    await assert_rejection_audited(database_url, run["id"], code)


@pytest.mark.parametrize(
    "content",
    [b"this is not json", b'{"tool_calls": [', b"", b"\xff\xfe\x00"],
    ids=["text", "truncated", "empty", "binary"],
)
async def test_a_body_that_is_not_json_is_invalid_tool_call(client, database_url, probe, content):
    run = await create_run(client, BOB)
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", content=content, headers={**BOB, "Content-Type": "application/json"}
    )
    assert_error(response, 422, "INVALID_TOOL_CALL")
    await assert_nothing_ran(client, database_url, probe, run["id"])
    await assert_rejection_audited(database_url, run["id"], "INVALID_TOOL_CALL")


async def test_a_number_past_a_float_in_arguments_given_as_an_object_says_so(client, database_url, probe):
    # Given as an object, the arguments are part of the body: the batch is refused whole, in
    # words that name the problem (given as a string, the call alone gets INVALID_ARGUMENTS).
    run = await create_run(client, BOB)
    content = (b'{"tool_calls": [{"id": "c1", "type": "function",'
               b' "function": {"name": "add", "arguments": {"a": 1e400, "b": 1}}}]}')
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", content=content, headers={**BOB, "Content-Type": "application/json"}
    )
    error = assert_error(response, 422, "INVALID_TOOL_CALL")
    assert "number too large for a 64-bit float" in error["message"]
    await assert_nothing_ran(client, database_url, probe, run["id"])


@pytest.mark.parametrize(
    "body",
    [[], [tool_call("add", {"a": 1, "b": 2}, call_id="a")], "tool_calls", 5, None, {"calls": []}, {"tool_calls": {}}],
    ids=["list", "list-of-calls", "string", "number", "null", "wrong-key", "calls-an-object"],
)
async def test_a_body_that_is_not_a_batch_object_is_invalid_tool_call(client, database_url, probe, body):
    run = await create_run(client, BOB)
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", content=json.dumps(body), headers={**BOB, "Content-Type": "application/json"}
    )
    assert_error(response, 422, "INVALID_TOOL_CALL")
    await assert_nothing_ran(client, database_url, probe, run["id"])
    await assert_rejection_audited(database_url, run["id"], "INVALID_TOOL_CALL")


async def test_an_empty_list_of_calls_is_invalid_tool_call(client, database_url, probe):
    run = await create_run(client, BOB)
    response = await client.post(f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": []}, headers=BOB)
    assert_error(response, 422, "INVALID_TOOL_CALL")
    await assert_rejection_audited(database_url, run["id"], "INVALID_TOOL_CALL")


async def test_a_batch_over_the_size_limit_is_invalid_tool_call(client, database_url, probe):
    run = await create_run(client, BOB)
    calls = [tool_call("count", {}, call_id=f"c{i}") for i in range(65)]
    response = await client.post(f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": calls}, headers=BOB)
    assert_error(response, 422, "INVALID_TOOL_CALL")
    await assert_nothing_ran(client, database_url, probe, run["id"])


async def test_the_rejection_names_the_offending_call(client):
    run = await create_run(client, BOB)
    wrong_type = {"id": "b", "type": "tool", "function": {"name": "add", "arguments": "{}"}}
    body = {"tool_calls": [tool_call("add", {"a": 1, "b": 2}, call_id="a"), wrong_type]}
    error = assert_error(await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB), 422, "INVALID_TOOL_CALL")
    assert "tool_calls[1]" in error["message"]


async def test_the_same_batch_made_valid_then_runs(client, probe):
    run = await create_run(client, BOB)
    empty_id = {"id": "", "type": "function", "function": {"name": "count", "arguments": "{}"}}
    body = {"tool_calls": [tool_call("count", {}, call_id="a"), empty_id]}
    assert (await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB)).status_code == 422
    body["tool_calls"][1]["id"] = "b"
    assert (await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB)).status_code == 200
    assert probe.executions == {"a": 1, "b": 1}


@pytest.mark.parametrize(
    "bad_call",
    [
        {"id": "c\u00001", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
        {"id": "c1", "type": "function", "function": {"name": "ad\u0000d", "arguments": '{"a": 1, "b": 2}'}},
    ],
    ids=["nul-in-id", "nul-in-name"],
)
async def test_a_nul_character_in_an_id_or_name_is_invalid_tool_call_not_a_server_error(client, database_url, probe, bad_call):
    run = await create_run(client, BOB)
    body = {"tool_calls": [tool_call("count", {}, call_id="ok_1"), bad_call]}
    assert_error(await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB), 422, "INVALID_TOOL_CALL")
    await assert_nothing_ran(client, database_url, probe, run["id"])
