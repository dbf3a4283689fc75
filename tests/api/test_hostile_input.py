"""Hostile input is a 4xx with the envelope, never a 5xx: deep JSON, text PostgreSQL cannot
store, keys given twice, numbers and times out of range, on every route that decodes input."""

from __future__ import annotations

import base64
import json

import pytest

from tests.support import db
from tests.support.calls import create_run, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")
CAROL = auth_for("carol")
JSON = {"Content-Type": "application/json"}
DEEP = "[" * 1000 + "]" * 1000


def cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


async def post_raw(client, path: str, body: str | bytes, headers: dict[str, str], method: str = "POST"):
    return await client.request(method, path, content=body, headers={**headers, **JSON})


async def assert_rejection_audited(url: str, run_id: str) -> dict:
    (row,) = await db.audit_rows(url, run_id=run_id)
    assert (row.kind, row.outcome) == ("protocol_rejection", "INVALID_TOOL_CALL")
    return row


# --- deep JSON ------------------------------------------------------------------------------

DEEP_BODIES = {
    "run": ("POST", "/v1/runs", '{"limits": %s}' % DEEP, BOB),
    "chat": ("POST", "/v1/chat/completions", '{"messages": %s}' % DEEP, BOB),
    "resume": ("POST", "/v1/runs/run_x/resume", '{"stream": %s}' % DEEP, BOB),
    "role": ("POST", "/v1/admin/roles", '{"name": "r", "permissions": %s}' % DEEP, CAROL),
    "role-update": ("PUT", "/v1/admin/roles/member", '{"permissions": %s}' % DEEP, CAROL),
    "policy": ("PUT", "/v1/admin/tools/add", '{"allowed_roles": %s}' % DEEP, CAROL),
    "tenant": ("PATCH", "/v1/admin/tenant", '{"extra": %s}' % DEEP, CAROL),
    "reject": ("POST", "/v1/admin/approvals/apr_x/reject", '{"reason": %s}' % DEEP, CAROL),
}


@pytest.mark.parametrize("case", DEEP_BODIES, ids=list(DEEP_BODIES))
async def test_json_nested_past_the_limit_is_400_on_every_body_route(pg_client, case):
    method, path, body, headers = DEEP_BODIES[case]
    error = assert_error(await post_raw(pg_client, path, body, headers, method), 400, "INVALID_REQUEST")
    assert "more than 64 levels deep" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        '{"tool_calls": [], "extra": %s}' % DEEP,
        '{"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": %s}}}]}'
        % DEEP,
    ],
    ids=["in-an-extra-field", "in-an-arguments-object"],
)
async def test_a_tool_call_batch_nested_past_the_limit_is_refused_whole_and_audited(pg_client, seeded_pg_url, body):
    run = await create_run(pg_client, BOB)
    response = await post_raw(pg_client, f"/v1/runs/{run['id']}/tool-calls", body, BOB)
    error = assert_error(response, 422, "INVALID_TOOL_CALL")
    assert "more than 64 levels deep" in error["message"]
    await assert_rejection_audited(seeded_pg_url, run["id"])


async def test_arguments_nested_past_the_limit_are_invalid_arguments_for_that_call_only(pg_client):
    run = await create_run(pg_client, BOB)
    body = {"tool_calls": [
        tool_call("add", raw='{"a": %s, "b": 1}' % ("[" * 1000 + "]" * 1000), call_id="deep"),
        tool_call("add", {"a": 1, "b": 2}, call_id="fine"),
    ]}
    response = await pg_client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB)
    assert response.status_code == 200, response.text
    deep, fine = (json.loads(m["content"]) for m in response.json()["messages"])
    assert deep["error"]["code"] == "INVALID_ARGUMENTS" and "more than 64 levels deep" in deep["error"]["message"]
    assert fine["ok"] is True


@pytest.mark.parametrize("settings_overrides", [{"max_json_depth": 3}])
async def test_the_depth_limit_is_the_setting(pg_client, settings_overrides):
    assert (await pg_client.post("/v1/runs", content='{"limits": {}}', headers={**BOB, **JSON})).status_code == 201
    error = assert_error(
        await post_raw(pg_client, "/v1/runs", '{"limits": {"x": [[1]]}}', BOB), 400, "INVALID_REQUEST"
    )
    assert "more than 3 levels deep" in error["message"]


# --- text PostgreSQL cannot store -------------------------------------------------------------


async def test_a_nul_in_a_key_of_the_batch_is_refused_whole_and_audited(pg_client, seeded_pg_url):
    run = await create_run(pg_client, BOB)
    body = '{"tool_calls": [{"id": "c1", "type": "function", "x\\u0000": 1, "function": {"name": "add", "arguments": "{}"}}]}'
    error = assert_error(await post_raw(pg_client, f"/v1/runs/{run['id']}/tool-calls", body, BOB), 422, "INVALID_TOOL_CALL")
    assert "NUL" in error["message"]
    await assert_rejection_audited(seeded_pg_url, run["id"])


async def test_a_lone_surrogate_given_twice_as_an_argument_key_is_invalid_arguments(pg_client, seeded_pg_url):
    run = await create_run(pg_client, BOB)
    body = {"tool_calls": [tool_call("add", raw='{"\\ud800": 1, "\\ud800": 2}', call_id="c1")]}
    response = await pg_client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=BOB)
    assert response.status_code == 200, response.text
    (message,) = response.json()["messages"]
    assert json.loads(message["content"])["error"]["code"] == "INVALID_ARGUMENTS"
    (row,) = await db.audit_rows(seeded_pg_url, run_id=run["id"])
    assert row.outcome == "INVALID_ARGUMENTS"


@pytest.mark.parametrize("path", ["/v1/admin/audit", "/v1/admin/audit/export"])
@pytest.mark.parametrize("parameter", ["user", "tool", "outcome", "run", "approval"])
async def test_a_nul_in_an_audit_filter_is_400_before_any_query_or_stream(pg_client, path, parameter):
    error = assert_error(await pg_client.get(f"{path}?{parameter}=a%00b", headers=CAROL), 400, "INVALID_REQUEST")
    assert f"`{parameter}`" in error["message"] and "NUL" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/admin/roles", '{"name": "nul", "description": "a\\u0000b", "permissions": []}'),
        ("PUT", "/v1/admin/roles/member", '{"description": "a\\u0000b", "permissions": ["articles:read"]}'),
        ("POST", "/v1/admin/roles", '{"name": "nul", "description": "\\udc00", "permissions": []}'),
    ],
    ids=["create", "update", "lone-surrogate"],
)
async def test_a_role_description_postgresql_cannot_store_is_400(pg_client, method, path, body):
    error = assert_error(await post_raw(pg_client, path, body, CAROL, method), 400, "INVALID_REQUEST")
    assert "NUL" in error["message"] or "surrogate" in error["message"]


async def test_a_cursor_holding_nul_in_its_id_is_400(pg_client):
    bad = cursor(["2026-01-01T00:00:00+00:00", "apr_\u0000"])
    assert_error(await pg_client.get(f"/v1/admin/approvals?cursor={bad}", headers=CAROL), 400, "INVALID_REQUEST")


# --- numbers and times out of range -------------------------------------------------------------

OUT_OF_RANGE = {
    "audit-cursor-past-bigint": ("/v1/admin/audit", {"cursor": cursor({"before": 2**63})}),
    "audit-since-before-year-1": ("/v1/admin/audit", {"since": "0001-01-01T00:00:00+05:00"}),
    "audit-until-after-year-9999": ("/v1/admin/audit", {"until": "9999-12-31T23:59:59-05:00"}),
    "export-until-after-year-9999": ("/v1/admin/audit/export", {"until": "9999-12-31T23:59:59-05:00"}),
    "audit-until-a-bare-number": ("/v1/admin/audit", {"until": "0.5"}),
    "audit-since-without-zone": ("/v1/admin/audit", {"since": "2026-01-01T00:00:00"}),
    "approvals-cursor-before-year-1": ("/v1/admin/approvals", {"cursor": cursor(["0001-01-01T00:00:00+05:00", "a"])}),
}


@pytest.mark.parametrize("case", OUT_OF_RANGE, ids=list(OUT_OF_RANGE))
async def test_numbers_and_times_out_of_range_are_400(pg_client, case):
    path, params = OUT_OF_RANGE[case]
    assert_error(await pg_client.get(path, params=params, headers=CAROL), 400, "INVALID_REQUEST")


async def test_a_time_filter_in_range_still_filters(pg_client):
    response = await pg_client.get("/v1/admin/audit", params={"since": "2000-01-01T05:00:00+05:00"}, headers=CAROL)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("expires_at", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
async def test_a_run_expiring_at_a_time_that_does_not_exist_in_utc_is_400(pg_client, expires_at):
    error = assert_error(
        await pg_client.post("/v1/runs", json={"expires_at": expires_at}, headers=BOB), 400, "INVALID_REQUEST"
    )
    assert "`expires_at`" in error["message"]


# --- one strictness rule, in clear words -------------------------------------------------------


async def test_an_admin_body_giving_a_key_twice_is_refused(pg_client):
    error = assert_error(
        await post_raw(pg_client, "/v1/admin/tenant", '{"max_run_ttl_s": 100, "max_run_ttl_s": 200}', CAROL, "PATCH"),
        400, "INVALID_REQUEST",
    )
    assert "`max_run_ttl_s` is given more than once" in error["message"]
    caps = (await pg_client.get("/v1/admin/tenant", headers=CAROL)).json()["caps"]
    assert caps["max_run_ttl_s"] not in (100, 200)


async def test_rejecting_without_a_body_says_what_the_body_must_hold(pg_client):
    error = assert_error(await pg_client.post("/v1/admin/approvals/apr_x/reject", headers=CAROL), 400, "INVALID_REQUEST")
    assert error["message"] == (
        "Invalid request body: it is empty; expected a JSON object with the fields `reason` (`reason` required)."
    )


async def test_an_unknown_field_is_named_with_the_fields_expected_never_data(pg_client):
    error = assert_error(
        await pg_client.post("/v1/admin/roles", json={"name": "r", "permissions": [], "colour": "red"}, headers=CAROL),
        400, "INVALID_REQUEST",
    )
    assert error["message"] == (
        "Invalid request body: `colour` is not a known field; expected only `name`, `description`, `permissions`."
    )


async def test_a_value_of_the_wrong_type_is_not_coerced(pg_client):
    error = assert_error(await pg_client.post("/v1/runs", json={"max_tool_calls": "5"}, headers=BOB), 400, "INVALID_REQUEST")
    assert "`max_tool_calls`" in error["message"] and "data" not in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [("POST", "/v1/runs", BOB), ("POST", "/v1/admin/roles", CAROL), ("PATCH", "/v1/admin/tenant", CAROL)],
)
async def test_malformed_json_says_so_and_where_it_broke(pg_client, method, path, headers):
    error = assert_error(await post_raw(pg_client, path, '{\n  "name": "x",\n  "oops" 1\n}', headers, method), 400, "INVALID_REQUEST")
    assert "not valid JSON" in error["message"] and "line 3, column" in error["message"]


async def test_an_unknown_key_inside_a_tool_call_entry_refuses_the_batch_like_one_at_the_top(pg_client, seeded_pg_url):
    run = await create_run(pg_client, BOB)
    entry = {**tool_call("add", {"a": 1, "b": 2}, call_id="c1"), "extra": True}
    response = await pg_client.post(f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": [entry]}, headers=BOB)
    error = assert_error(response, 422, "INVALID_TOOL_CALL")
    assert "`tool_calls[0].extra` is not a known field" in error["message"]
    await assert_rejection_audited(seeded_pg_url, run["id"])


async def test_an_unknown_key_inside_function_refuses_the_batch(pg_client):
    run = await create_run(pg_client, BOB)
    entry = tool_call("add", {"a": 1, "b": 2}, call_id="c1")
    entry["function"]["strict"] = True
    response = await pg_client.post(f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": [entry]}, headers=BOB)
    error = assert_error(response, 422, "INVALID_TOOL_CALL")
    assert "`tool_calls[0].function.strict` is not a known field; expected only `name`, `arguments`" in error["message"]


@pytest.mark.parametrize(
    "query",
    ["limit=1.0", "limit=1e2", "limit=%2B1", "limit=%201", "limit=0x10", "limit=1&limit=2",
     "status=pending&status=rejected"],
)
@pytest.mark.parametrize("path", ["/v1/admin/approvals", "/v1/admin/audit"])
async def test_a_query_integer_not_in_decimal_digits_or_a_parameter_given_twice_is_400(pg_client, path, query):
    """A review's reproduction: `limit=1.0` read as 1, and `status=pending&status=rejected`
    silently took one of the two, where a body refuses a repeated key for that ambiguity."""
    if path == "/v1/admin/audit" and query.startswith("status"):
        query = "kind=tool_call&kind=approval_decision"
    response = await pg_client.get(f"{path}?{query}", headers=auth_for("carol"))
    assert_error(response, 400, "INVALID_REQUEST")


async def test_a_plain_query_integer_is_still_read(pg_client):
    response = await pg_client.get("/v1/admin/approvals?limit=2", headers=auth_for("carol"))
    assert response.status_code == 200, response.text
