"""The MCP endpoint's JSON-RPC parser under hostile input: every malformed body is a JSON-RPC
error object with a fixed message (never a stack trace, never the envelope of a 500), and
nothing malformed reaches the executor."""

from __future__ import annotations

import json

import pytest

from tests.support import db
from tests.support.tokens import auth_for

ALICE = auth_for("alice")
HEADERS = {**ALICE, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
LEGACY = {**HEADERS, "MCP-Protocol-Version": "2025-11-25"}


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {**HEADERS, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def envelope(**extra: object) -> dict:
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        **extra,
    }


async def post(client, body: bytes | str, headers: dict[str, str] = LEGACY):
    return await client.post("/mcp", content=body, headers=headers)


def assert_rpc_error(response, code: int, status: int, request_id: object = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == request_id, body
    assert body["error"]["code"] == code, body
    for leak in ("Traceback", "Error(", "msgspec", "RecursionError", "line "):
        assert leak not in response.text
    return body["error"]


async def initialize(client) -> str:
    response = await post(
        client,
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
        HEADERS,
    )
    assert response.status_code == 200, response.text
    assert response.json()["result"]["protocolVersion"] == "2025-06-18"
    return response.headers["mcp-session-id"]


def call(request_id: object = 7, **params: object) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


# --- the envelope -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", -32700),
        (b"{", -32700),
        (b"not json", -32700),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"} trailing', -32700),
        (b"\xff\xfe", -32700),
        (b"42", -32600),
        (b'"tools/list"', -32600),
        (b"null", -32600),
        (b"[]", -32600),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]', -32600),
        (b'{"jsonrpc": "1.0", "method": "tools/list"}', -32600),
        (b'{"id": 1, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', -32600),
        (b'{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": "", "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1e300, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 99999999999999999999999, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": "x", "result": {}}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "tools/list"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "extra": 1}', -32600),
    ],
)
async def test_a_malformed_body_is_a_json_rpc_error(client, body, code):
    response = await post(client, body)
    error = assert_rpc_error(response, code, 400, request_id=answerable_id(body))
    assert error["message"]


def answerable_id(body: bytes) -> object:
    """The id an error names: the request's, when it is one that can be answered."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or b'"id": 1, "id"' in body:
        return None
    value = document.get("id")
    if isinstance(value, str) and value or type(value) is int and abs(value) < 2**53:
        return value
    return None


async def test_a_string_id_longer_than_the_bound_is_refused(client):
    response = await post(client, json.dumps({"jsonrpc": "2.0", "id": "x" * 201, "method": "tools/list"}))
    assert_rpc_error(response, -32600, 400)
    assert "x" * 201 not in response.text


async def test_deep_nesting_is_refused_before_decoding(client):
    deep = '{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"
    error = assert_rpc_error(await post(client, deep), -32600, 400)
    assert "levels deep" in error["message"]


@pytest.mark.parametrize("text", ["\\u0000", "a\\u0000b", "\\ud800"])
async def test_text_postgresql_cannot_store_is_refused(client, text):
    body = '{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "add", "arguments": {"a": "' + text + '"}}}'
    error = assert_rpc_error(await post(client, body), -32600, 400)
    assert error["message"].startswith("Invalid request")


async def test_a_nul_in_the_method_is_refused(client):
    assert_rpc_error(await post(client, b'{"jsonrpc": "2.0", "id": 1, "method": "tools/\\u0000list"}'), -32600, 400)


async def test_an_unknown_method_is_method_not_found_with_the_request_id(client):
    response = await post(client, json.dumps({"jsonrpc": "2.0", "id": "abc", "method": "resources/list"}))
    assert_rpc_error(response, -32601, 404, request_id="abc")


async def test_params_that_are_not_an_object_are_invalid_params(client):
    response = await post(client, json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": [1]}))
    assert_rpc_error(response, -32602, 400, request_id=9)


async def test_a_body_over_the_size_cap_is_a_json_rpc_error_413(client):
    body = call(arguments={"padding": "x" * 2_000_000}, name="add")
    response = await post(client, body)
    assert_rpc_error(response, -32600, 413)


async def test_a_notification_is_accepted_with_no_body(client):
    response = await post(client, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    assert response.status_code == 202 and response.content == b""


async def test_a_notification_does_not_execute_anything(client, database_url):
    body = json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1, "b": 2}}})
    response = await post(client, body)
    assert response.status_code == 202
    assert await db.audit_rows(database_url) == []


async def test_a_content_type_other_than_json_is_refused(client):
    response = await post(client, call(name="add"), {**LEGACY, "Content-Type": "text/plain"})
    assert_rpc_error(response, -32600, 415)
    response = await client.post("/mcp", content=call(name="add"), headers={**ALICE, "Accept": "application/json"})
    assert_rpc_error(response, -32600, 415)


async def test_an_accept_header_without_json_is_refused(client):
    response = await post(client, call(name="add"), {**LEGACY, "Accept": "text/event-stream"})
    assert_rpc_error(response, -32600, 406)


async def test_get_opens_no_stream(client):
    response = await client.get("/mcp", headers={**ALICE, "Accept": "text/event-stream"})
    assert response.status_code == 405 and "POST" in response.headers["allow"]


# --- tools/call parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"name": 5},
        {"name": ""},
        {"name": "x" * 200},
        {"name": "add", "arguments": [1, 2]},
        {"name": "add", "arguments": "{}"},
        {"name": "add", "arguments": {}, "_meta": []},
        {"name": "add", "arguments": {}, "_meta": {"gateway/run_id": 5}},
    ],
)
async def test_bad_tool_call_params_are_invalid_params(client, params, database_url):
    session = await initialize(client)
    response = await post(client, call(**params), {**LEGACY, "Mcp-Session-Id": session})
    assert_rpc_error(response, -32602, 400, request_id=7)
    rows = await db.audit_rows(database_url, run_id=session)
    assert [r for r in rows if r.kind == "tool_call"] == []
    if "_meta" not in params:  # the run is known: the refusal is audited against it, as REST does
        (row,) = rows
        assert (row.kind, row.outcome) == ("protocol_rejection", "INVALID_TOOL_CALL")
        assert row.request_id == response.headers["x-request-id"]


async def test_a_call_without_a_session_or_run_is_refused(client):
    response = await post(client, call(name="add", arguments={"a": 1, "b": 2}))
    assert_rpc_error(response, -32600, 400, request_id=7)


@pytest.mark.parametrize("session", ["nope", "run_" + "0" * 32, "run_" + "G" * 32, "run_" + "0" * 300])
async def test_an_unknown_session_is_not_found(client, session):
    headers = {**LEGACY, "Mcp-Session-Id": session}
    response = await post(client, call(name="add", arguments={"a": 1, "b": 2}), headers)
    assert_rpc_error(response, -32600, 404, request_id=7)


async def test_a_named_run_that_cannot_exist_is_not_found_as_a_tool_result(client):
    session = await initialize(client)
    body = call(name="add", arguments={"a": 1, "b": 2}, _meta={"gateway/run_id": "r" * 300})
    response = await post(client, body, {**LEGACY, "Mcp-Session-Id": session})
    result = response.json()["result"]
    assert result["isError"] is True and result["structuredContent"]["code"] == "NOT_FOUND"


async def test_a_session_answers_a_call_and_echoes_its_id(client):
    session = await initialize(client)
    response = await post(client, call(name="add", arguments={"a": 2, "b": 3}), {**LEGACY, "Mcp-Session-Id": session})
    assert response.status_code == 200 and response.headers["mcp-session-id"] == session
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"content": [{"type": "text", "text": "5"}], "structuredContent": {"result": 5}, "isError": False},
    }


# --- the 2026-07-28 envelope -----------------------------------------------------------------------


async def test_discover_answers_the_modern_version(client):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": envelope()}})
    response = await post(client, body, modern_headers("server/discover"))
    result = response.json()["result"]
    assert result["supportedVersions"] == ["2026-07-28"] and result["resultType"] == "complete"
    assert "mcp-session-id" not in response.headers


@pytest.mark.parametrize(
    ("headers", "meta", "code"),
    [
        (modern_headers("tools/list"), None, -32602),
        (modern_headers("tools/list"), {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}, -32602),
        (modern_headers("tools/call"), envelope(), -32020),
        ({**modern_headers("tools/list"), "MCP-Protocol-Version": "2099-01-01"}, envelope(), -32020),
    ],
)
async def test_a_broken_modern_envelope_is_refused(client, headers, meta, code):
    params = {} if meta is None else {"_meta": meta}
    response = await post(client, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": params}), headers)
    assert_rpc_error(response, code, 400, request_id=2)


async def test_an_unsupported_modern_version_names_the_supported_ones(client):
    headers = {**modern_headers("tools/list"), "MCP-Protocol-Version": "2099-01-01"}
    meta = envelope(**{"io.modelcontextprotocol/protocolVersion": "2099-01-01"})
    response = await post(client, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}}), headers)
    error = assert_rpc_error(response, -32022, 400, request_id=2)
    assert error["data"] == {"supported": ["2026-07-28"], "requested": "2099-01-01"}


async def test_a_call_whose_name_header_disagrees_is_refused(client, database_url):
    body = call(name="add", arguments={"a": 1, "b": 2}, _meta=envelope())
    response = await post(client, body, modern_headers("tools/call", "multiply"))
    assert_rpc_error(response, -32020, 400, request_id=7)
    assert await db.audit_rows(database_url) == []


# --- authentication and metadata ------------------------------------------------------------------


async def test_no_token_is_401_naming_the_resource_metadata(client):
    response = await client.post("/mcp", content=call(name="add"), headers={"Content-Type": "application/json"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == (
        'Bearer resource_metadata="http://testserver.local/.well-known/oauth-protected-resource/mcp"'
    )


async def test_a_bad_token_is_401_naming_the_resource_metadata(client):
    response = await client.post("/mcp", content=call(name="add"), headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert "resource_metadata=" in response.headers["www-authenticate"]


async def test_the_rest_api_keeps_its_own_challenge(client):
    response = await client.get("/v1/tools")
    assert response.headers["www-authenticate"] == 'Bearer realm="gateway"'


async def test_the_resource_metadata_is_public(client):
    for path, resource in [
        ("/.well-known/oauth-protected-resource/mcp", "http://testserver.local/mcp"),
        ("/.well-known/oauth-protected-resource", "http://testserver.local"),
    ]:
        response = await client.get(path)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "resource": resource,
            "bearer_methods_supported": ["header"],
            "resource_name": "gateway",
        }


async def test_the_metadata_exclusion_is_anchored():
    from gateway.auth.middleware import PUBLIC_PATHS
    import re

    for path in ("/v1/x/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcpx", "/mcp"):
        assert not any(re.search(pattern, path) for pattern in PUBLIC_PATHS), path


async def test_options_on_mcp_needs_a_token(client):
    response = await client.options("/mcp")
    assert response.status_code == 401


# --- listing and auditing -------------------------------------------------------------------------


async def test_tools_list_is_byte_stable_and_lists_what_the_rest_api_lists(client):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    first, second = await post(client, body), await post(client, body)
    assert first.content == second.content
    listed = [tool["name"] for tool in first.json()["result"]["tools"]]
    rest = [tool["function"]["name"] for tool in (await client.get("/v1/tools", headers=ALICE)).json()["tools"]]
    assert listed == rest


async def test_every_refused_call_is_audited_with_its_request_id(client, database_url):
    session = await initialize(client)
    response = await post(
        client, call(name="create_article", arguments={"title": "t", "body": "b"}), {**LEGACY, "Mcp-Session-Id": session}
    )
    assert response.json()["result"]["structuredContent"]["code"] == "PERMISSION_DENIED"
    (row,) = [r for r in await db.audit_rows(database_url, run_id=session) if r.kind == "tool_call"]
    assert row.outcome == "PERMISSION_DENIED" and row.request_id == response.headers["x-request-id"]
    assert row.tool == "create_article" and row.tool_call_id.startswith("mcp_")
