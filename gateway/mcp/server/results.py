"""A guarded call's answer as an MCP ``CallToolResult``.

Success: ``structuredContent`` is the tool's result (an object; any other JSON value is
wrapped as ``{"result": value}``) and ``content`` holds its JSON as text. Any gateway code:
``isError: true``, ``structuredContent`` is ``{code, message, retryable, approval_id?,
error_id?}`` (what the REST route's ``error`` says) and ``content`` holds the message.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.errors import ErrorCode
from gateway.execution.executor import ToolMessage
from gateway.execution.results import ErrorDetail, error_detail


class _Stored(msgspec.Struct):
    ok: bool
    result: msgspec.Raw = msgspec.Raw(b"null")
    truncated: bool = False
    original_bytes: int | None = None
    error: ErrorDetail | None = None


_stored = msgspec.json.Decoder(_Stored)
_encoder = msgspec.json.Encoder()


def call_result(message: ToolMessage) -> dict[str, Any]:
    if message.error is not None:
        return error_result(message.error)
    try:
        stored = _stored.decode(message.content)
    except msgspec.DecodeError:
        return error_result(error_detail(ErrorCode.TOOL_EXECUTION_FAILED))
    if not stored.ok:
        return error_result(stored.error or error_detail(ErrorCode.TOOL_EXECUTION_FAILED))
    raw = bytes(stored.result)
    structured = stored.result if raw[:1] == b"{" else msgspec.Raw(b'{"result":' + raw + b"}")
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": raw.decode()}],
        "structuredContent": structured,
        "isError": False,
    }
    if stored.truncated:
        result["_meta"] = {"gateway/truncated": True, "gateway/original_bytes": stored.original_bytes}
    return result


def error_result(detail: ErrorDetail) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": detail.message}],
        "structuredContent": msgspec.Raw(_encoder.encode(detail)),
        "isError": True,
    }
