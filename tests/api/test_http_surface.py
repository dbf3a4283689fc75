"""The HTTP surface: public routes, one error envelope for everything, request ids, OpenAPI."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from gateway.db.models import Approval
from tests.support import db
from tests.support.http import assert_error
from tests.support.tokens import auth_for


@pytest.fixture
def settings_overrides():
    return {"max_body_bytes": 2048}


async def test_healthz_is_public(client):
    response = await client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


async def test_readyz_answers_when_the_database_does(client):
    response = await client.get("/readyz")
    assert response.status_code == 200 and response.json() == {"status": "ready"}


async def test_the_openapi_document_is_public(client):
    assert (await client.get("/schema/openapi.json")).status_code == 200


@pytest.mark.parametrize("path", ["/v1/runs/healthz", "/v1/runs/readyz", "/v1/runs/schema"])
async def test_a_v1_path_that_contains_a_public_path_still_needs_a_token(client, path):
    assert_error(await client.get(path), 401, "UNAUTHENTICATED")


@pytest.mark.parametrize("path", ["/v1/runs/healthz", "/v1/approvals/schema"])
async def test_a_v1_path_that_contains_a_public_path_reads_the_token(client, path):
    # Were the path excluded from authentication, the handler would see no caller (401).
    assert_error(await client.get(path, headers=auth_for("alice")), 404, "NOT_FOUND")


async def test_an_unknown_route_is_not_found_in_the_envelope(client):
    assert_error(await client.get("/v2/nothing-here", headers=auth_for("alice")), 404, "NOT_FOUND")


async def test_an_unknown_route_without_a_token_is_not_found_in_the_envelope(client):
    assert_error(await client.get("/nothing-here"), 404, "NOT_FOUND")


async def test_a_wrong_method_is_method_not_allowed_in_the_envelope(client):
    assert_error(await client.delete("/v1/tools", headers=auth_for("alice")), 405, "METHOD_NOT_ALLOWED")


async def test_a_body_over_the_limit_is_payload_too_large(client):
    run = (await client.post("/v1/runs", headers=auth_for("alice"))).json()
    body = b'{"tool_calls": [' + b" " * 4096 + b"]}"
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", content=body, headers={**auth_for("alice"), "Content-Type": "application/json"}
    )
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


async def test_a_body_over_the_limit_to_create_a_run_is_payload_too_large(client):
    body = b'{"max_tool_calls": 5' + b" " * 4096 + b"}"
    response = await client.post("/v1/runs", content=body, headers={**auth_for("alice"), "Content-Type": "application/json"})
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


async def test_invalid_json_to_create_a_run_is_invalid_request(client):
    response = await client.post(
        "/v1/runs", content=b"{not json", headers={**auth_for("alice"), "Content-Type": "application/json"}
    )
    assert_error(response, 400, "INVALID_REQUEST")


async def test_a_given_request_id_is_echoed_in_the_header_and_the_error_body(client):
    response = await client.get("/v1/tools", headers={"X-Request-ID": "trace-123.abc"})
    error = assert_error(response, 401, "UNAUTHENTICATED")
    assert error["request_id"] == "trace-123.abc" == response.headers["x-request-id"]


async def test_a_request_id_is_made_when_none_is_given(client):
    response = await client.get("/healthz")
    assert response.headers["x-request-id"].startswith("req_")


async def test_a_request_id_that_is_not_well_formed_is_replaced(client):
    response = await client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    assert response.headers["x-request-id"].startswith("req_")


async def test_each_request_gets_its_own_request_id(client):
    first = await client.get("/healthz")
    second = await client.get("/healthz")
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


async def test_an_unexpected_error_is_internal_error_with_an_error_id_and_no_trace(client, database_url, logs):
    # Corrupt the stored frozen arguments so that reading the approval fails in an unforeseen way
    # (a stored outcome that does not read is shown as its text: test_results.py).
    run = (await client.post("/v1/runs", headers=auth_for("bob"))).json()
    body = {"tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "create_article", "arguments": '{"title": "t", "body": "b"}'}}]}
    content = (await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=auth_for("bob"))).json()
    approval_id = json.loads(content["messages"][0]["content"])["error"]["approval_id"]
    table = Approval.__table__
    await db.execute(
        database_url,
        sa.update(table).where(table.c.id == approval_id).values(canonical_arguments="{corrupt <secret-marker>"),
    )
    response = await client.get(f"/v1/approvals/{approval_id}", headers=auth_for("bob"))
    error = assert_error(response, 500, "INTERNAL_ERROR")
    for detail in ("secret-marker", "Traceback", "DecodeError", "msgspec", "approvals.py"):
        assert detail not in response.text
    (event,) = logs.named("unhandled_exception")
    assert event["error_id"] == error["error_id"]
    assert "Traceback" in event["exception"]
