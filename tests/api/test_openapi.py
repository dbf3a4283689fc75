"""/schema/openapi.json: a valid, complete and typed OpenAPI document."""

from __future__ import annotations

import re

import pytest
from openapi_spec_validator import validate

from tests.support.tokens import auth_for

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


PUBLIC = ("/healthz", "/readyz", "/.well-known/jwks.json")


def body_schema(document, operation):
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    for option in schema.get("oneOf", schema.get("anyOf", [schema])):
        if option.get("type") != "null":
            return resolve(document, option)
    raise AssertionError(schema)


def not_null(schema):
    """The non-null branch of ``X | None``."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") != "null":
            return option
    raise AssertionError(schema)


async def test_every_request_body_refuses_unknown_fields_as_the_server_does(document):
    bodies = [(p, m, o) for p, m, o in operations(document) if "requestBody" in o]
    assert len(bodies) >= 9
    for path, method, operation in bodies:
        assert body_schema(document, operation)["additionalProperties"] is False, (path, method)
    for name in ("RunLimitsIn", "GatewayOptions", "StreamOptions", "ChatMessageIn", "ToolPolicyIn", "RoleUpdate"):
        assert document["components"]["schemas"][name]["additionalProperties"] is False, name


async def test_bounds_patterns_and_enums_the_server_enforces_are_in_the_schema(document):
    schemas = document["components"]["schemas"]
    assert not_null(schemas["GatewayOptions"]["properties"]["timeout_s"])["exclusiveMinimum"] == 0
    assert not_null(schemas["ToolPolicyIn"]["properties"]["timeout_s"])["exclusiveMinimum"] == 0
    assert schemas["RoleCreate"]["properties"]["permissions"]["items"]["pattern"].startswith("^[a-z]")
    assert not_null(schemas["ToolPolicyIn"]["properties"]["allowed_roles"])["items"]["pattern"]
    assert schemas["ToolPolicyIn"]["properties"]["approval_mode"]["enum"] == ["always", "mutating", "never"]
    assert not_null(schemas["RunLimitsIn"]["properties"]["expires_at"])["format"] == "date-time"
    status = next(
        p for p in document["paths"]["/v1/admin/approvals"]["get"]["parameters"] if p["name"] == "status"
    )
    assert set(status["schema"]["enum"]) >= {"pending", "executing", "succeeded", "failed", "rejected", "expired"}
    export_format = next(
        p for p in document["paths"]["/v1/admin/audit/export"]["get"]["parameters"] if p["name"] == "format"
    )
    assert export_format["schema"]["enum"] == ["jsonl", "csv"]


async def test_the_tool_call_fields_are_required_and_never_null(document):
    operation = document["paths"]["/v1/runs/{run_id}/tool-calls"]["post"]
    batch_schema = body_schema(document, operation)
    calls = batch_schema["properties"]["tool_calls"]
    assert calls["minItems"] == 1 and calls["maxItems"] == 64  # GATEWAY_MAX_BATCH_SIZE
    call = resolve(document, calls["items"])
    assert set(call["required"]) == {"id", "type", "function"}
    assert call["properties"]["id"]["type"] == "string" and call["properties"]["id"]["minLength"] == 1
    assert call["properties"]["type"] == {"enum": ["function"]}
    function = resolve(document, call["properties"]["function"])
    assert set(function["required"]) == {"name", "arguments"}
    for schema in (call["properties"]["id"], function["properties"]["name"]):
        assert "anyOf" not in schema and schema["type"] == "string"


async def test_a_body_the_route_can_do_without_is_documented_optional(document):
    optional = {("/v1/runs", "post"), ("/v1/runs/{run_id}/resume", "post")}
    for path, method, operation in operations(document):
        if "requestBody" in operation:
            assert operation["requestBody"].get("required", False) is ((path, method) not in optional), (path, method)


async def test_public_routes_need_no_token_and_answer_head(document):
    for path in PUBLIC:
        for method, operation in document["paths"][path].items():
            assert operation["security"] == [], (path, method)
    assert {"get", "head"} <= set(document["paths"]["/healthz"]) and {"get", "head"} <= set(document["paths"]["/readyz"])
    for path, method, operation in operations(document):
        if path not in PUBLIC:
            assert "security" not in operation, (path, method)  # the document's bearer requirement applies


async def test_every_route_documents_the_errors_it_can_answer(document):
    for path, method, operation in operations(document):
        statuses = set(operation["responses"])
        if path not in PUBLIC:
            assert {"401", "403", "429", "503"} <= statuses, (path, method)
        if "requestBody" in operation:
            assert {"400", "413"} <= statuses, (path, method)
        if "{" in path:
            assert {"400", "404"} <= statuses, (path, method)


async def test_a_query_parameter_no_route_reads_answers_a_documented_400_on_every_get(client, document):
    """A review's reproduction: a NUL in any query parameter is refused on every route, while
    routes without parameters or body did not document 400."""
    for path, method, operation in operations(document):
        if method != "get" or "{" in path:
            continue
        response = await client.get(path, params={"x": "\x00"}, headers=auth_for("carol"))
        assert response.status_code == 400, (path, response.status_code)
        assert "400" in operation["responses"], path


async def test_answers_that_carry_an_id_link_to_the_operations_that_take_it(document):
    links = document["paths"]["/v1/runs"]["post"]["responses"]["201"]["links"]
    by_target = {link["operationId"]: link["parameters"] for link in links.values()}
    get_run = document["paths"]["/v1/runs/{run_id}"]["get"]["operationId"]
    tool_calls = document["paths"]["/v1/runs/{run_id}/tool-calls"]["post"]["operationId"]
    assert by_target[get_run] == {"run_id": "$response.body#/id"}
    assert by_target[tool_calls] == {"run_id": "$response.body#/id"}
    role_links = document["paths"]["/v1/admin/roles"]["post"]["responses"]["201"]["links"]
    assert {link["parameters"]["name"] for link in role_links.values()} == {"$response.body#/name"}
    validate(document)


@pytest.mark.postgres
async def test_every_route_that_documents_413_answers_it_for_an_oversized_body(seeded_pg_url):
    from litestar.testing import AsyncTestClient

    from gateway.app import create_app
    from tests.support.app import make_settings

    app = create_app(make_settings(seeded_pg_url, max_body_bytes=1024))
    async with AsyncTestClient(app=app) as small:
        doc = (await small.get("/schema/openapi.json")).json()
        checked = 0
        for path, method, operation in operations(doc):
            if "requestBody" not in operation:
                continue
            assert "413" in operation["responses"], (path, method)
            url = path.replace("{run_id}", "run_x").replace("{approval_id}", "apr_x")
            url = url.replace("{name}", "member").replace("{tool}", "add")
            body = b'{"padding": "' + b"x" * 2048 + b'"}'
            response = await small.request(
                method.upper(), url, content=body, headers={**auth_for("carol"), "Content-Type": "application/json"}
            )
            assert response.status_code == 413, (path, method, response.status_code, response.text)
            assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
            checked += 1
        assert checked >= 9


@pytest.mark.postgres
async def test_options_allows_exactly_the_documented_methods_of_each_path(pg_client):

    doc = (await pg_client.get("/schema/openapi.json")).json()
    for path, item in doc["paths"].items():
        if path.startswith("/v1/"):
            url = path.replace("{run_id}", "run_x").replace("{approval_id}", "apr_x")
            url = url.replace("{name}", "member").replace("{tool}", "add")
            response = await pg_client.options(url, headers=auth_for("carol"))
            assert response.status_code == 204, (path, response.status_code, response.text)
            allowed = {m.strip() for m in response.headers["allow"].split(",")}
            assert allowed == {m.upper() for m in item if m in METHODS} | {"OPTIONS"}, path


LOOKAROUND_OR_BACKREFERENCE = re.compile(r"\(\?<?[=!]|\\[1-9]|\\k<")


def patterns_in(schema):
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from patterns_in(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from patterns_in(value)


async def test_every_published_pattern_is_plain_enough_for_any_regex_engine(document):
    # Clients validate with what they have: RE2 (Go) and Rust's regex refuse lookaround and
    # backreferences, so the API's and the tools' schemas use neither. The server closes the
    # gap Python's `$` leaves (a final newline) on its own side (gateway.text.refuse_line_breaks).
    from gateway.tools.builtin import builtin_tools

    published = list(patterns_in(document))
    published += [p for tool in builtin_tools() for p in patterns_in(tool.arguments.json_schema())]
    assert len(published) > 5
    assert [p for p in published if LOOKAROUND_OR_BACKREFERENCE.search(p)] == []
