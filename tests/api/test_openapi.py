"""/schema/openapi.json: a valid, complete and typed OpenAPI document."""

from __future__ import annotations

import pytest
from openapi_spec_validator import validate

METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
async def document(client):
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    return response.json()


def operations(document):
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def resolve(document, schema):
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = document["components"]["schemas"][name]
    return schema


async def test_the_document_is_valid_openapi(document):
    validate(document)


async def test_every_route_is_documented(document):
    assert {
        "/healthz",
        "/readyz",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/tool-calls",
        "/v1/tools",
        "/v1/approvals/{approval_id}",
        "/v1/admin/approvals",
        "/v1/admin/approvals/{approval_id}/approve",
        "/v1/admin/approvals/{approval_id}/reject",
    } <= set(document["paths"])


async def test_every_operation_has_typed_responses(document):
    for path, method, operation in operations(document):
        assert operation["responses"], (path, method)
        for status, response in operation["responses"].items():
            if status == "204":  # No Content: there is no body to describe
                continue
            content = response.get("content")
            assert content, (path, method, status)
            for media in content.values():
                assert resolve(document, media["schema"]), (path, method, status)


async def test_every_error_response_is_the_envelope(document):
    for path, method, operation in operations(document):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                schema = resolve(document, response["content"]["application/json"]["schema"])
                assert "error" in schema["properties"], (path, method, status)


async def test_the_tool_calls_request_body_is_documented(document):
    operation = document["paths"]["/v1/runs/{run_id}/tool-calls"]["post"]
    schema = resolve(document, operation["requestBody"]["content"]["application/json"]["schema"])
    assert schema["required"] == ["tool_calls"]
    assert schema["properties"]["tool_calls"]["type"] == "array"
    call = resolve(document, schema["properties"]["tool_calls"]["items"])
    assert {"id", "type", "function"} <= set(call["properties"])
    assert {"422", "404", "413", "401"} <= set(operation["responses"])


async def test_the_tool_calls_response_is_typed(document):
    operation = document["paths"]["/v1/runs/{run_id}/tool-calls"]["post"]
    schema = resolve(document, operation["responses"]["200"]["content"]["application/json"]["schema"])
    message = resolve(document, schema["properties"]["messages"]["items"])
    assert set(message["properties"]) == {"role", "tool_call_id", "content"}


async def test_routes_under_v1_declare_bearer_security(document):
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document.get("security") == [{"bearer": []}]
