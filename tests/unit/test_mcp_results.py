"""The pieces of the MCP endpoint that need no server: the envelope reader, the result
mapping, the tool listing's annotations and the key of a token's default run."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

from gateway.errors import ErrorCode
from gateway.execution.executor import ToolMessage
from gateway.execution.results import error_content, error_detail, ok_content
from gateway.mcp.server.listing import mcp_tool
from gateway.mcp.server.protocol import JsonRpcError, read_message
from gateway.mcp.server.results import call_result
from gateway.mcp.server.runs import token_identity
from gateway.tools.builtin import builtin_tools


def encoded(result: dict) -> dict:
    return json.loads(msgspec.json.encode(result))


def test_an_object_result_is_the_structured_content_and_its_text():
    message = ToolMessage(tool_call_id="c", content=ok_content(b'{"id":1,"title":"T"}'), outcome="OK")
    assert encoded(call_result(message)) == {
        "content": [{"type": "text", "text": '{"id":1,"title":"T"}'}],
        "structuredContent": {"id": 1, "title": "T"},
        "isError": False,
    }


@pytest.mark.parametrize("raw", [b"5", b"[1,2]", b'"text"', b"null", b"true"])
def test_any_other_result_is_wrapped_in_an_object(raw):
    result = encoded(call_result(ToolMessage(tool_call_id="c", content=ok_content(raw), outcome="OK")))
    assert result["structuredContent"] == {"result": json.loads(raw)}
    assert result["content"][0]["text"] == raw.decode()


def test_a_gateway_code_is_an_error_result_with_the_safe_message():
    detail = error_detail(ErrorCode.APPROVAL_REQUIRED, approval_id="apr_1")
    message = ToolMessage(tool_call_id="c", content=error_content(ErrorCode.APPROVAL_REQUIRED, approval_id="apr_1"),
                          outcome="APPROVAL_REQUIRED", error=detail)
    result = encoded(call_result(message))
    assert result["isError"] is True
    assert result["structuredContent"] == {
        "code": "APPROVAL_REQUIRED", "message": detail.message, "retryable": detail.retryable, "approval_id": "apr_1",
    }
    assert result["content"] == [{"type": "text", "text": detail.message}]


def test_stored_content_that_cannot_be_read_is_tool_execution_failed_not_a_crash():
    result = encoded(call_result(ToolMessage(tool_call_id="c", content="not json", outcome="OK")))
    assert result["isError"] is True and result["structuredContent"]["code"] == "TOOL_EXECUTION_FAILED"


def test_annotations_follow_whether_a_tool_changes_data():
    tools = {tool.name: tool for tool in builtin_tools()}
    assert mcp_tool(tools["create_article"])["annotations"] == {"readOnlyHint": False, "destructiveHint": True}
    assert mcp_tool(tools["add"])["annotations"] == {"readOnlyHint": True, "idempotentHint": True}
    assert mcp_tool(tools["add"])["inputSchema"] == tools["add"].arguments.json_schema()


def token(payload: dict) -> str:
    segment = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"e30.{segment}.sig"


def test_a_token_with_a_jti_is_named_by_it():
    first, _ = token_identity(token({"exp": 2_000_000_000, "jti": "abc", "iat": 1}))
    second, expires = token_identity(token({"exp": 2_000_000_000, "jti": "abc", "iat": 2}))
    assert first == second and first.startswith("jti:") and "abc" not in first
    assert expires.timestamp() == 2_000_000_000


def test_a_token_without_a_jti_is_named_by_its_hash():
    first, _ = token_identity(token({"exp": 2_000_000_000, "iat": 1}))
    second, _ = token_identity(token({"exp": 2_000_000_000, "iat": 2}))
    assert first != second and first.startswith("token:")


@pytest.mark.parametrize("bad", ["", "a", "a.!!!.b", token({"exp": "soon"}), token({"exp": 10**400})])
def test_an_unreadable_token_is_a_value_error(bad):
    with pytest.raises(ValueError, match="not a readable token"):
        token_identity(bad)


def test_a_message_keeps_its_id_and_params():
    message = read_message(b'{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"cursor":"x"}}', max_depth=32)
    assert (message.id, message.method, message.params) == ("a", "tools/list", {"cursor": "x"})


def test_a_notification_has_no_id():
    assert read_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', max_depth=32).id is None


def test_nesting_past_the_bound_never_reaches_the_decoder():
    with pytest.raises(JsonRpcError) as raised:
        read_message(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
                     max_depth=32)
    assert raised.value.code == -32600 and raised.value.status == 400
