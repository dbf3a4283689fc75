"""The JSON-RPC envelope of one streamable-HTTP POST, read under the gateway's input rules.

A body is one JSON-RPC request or notification object: batches (arrays) are refused, as the
2026-07-28 revision and the SDK's server refuse them. The body nests at most
``GATEWAY_MAX_JSON_DEPTH`` deep, holds only text PostgreSQL can store and gives each key
once (``gateway.text.json_document_problem``): checked before decoding, so deep nesting is
an error, never a ``RecursionError``. Every problem is a JSON-RPC error with a fixed,
safe message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from mcp_types.jsonrpc import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
)

from gateway.text import json_document_problem

__all__ = [
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "JsonRpcError",
    "Message",
    "read_message",
]

MAX_ID_LENGTH = 200
"""The longest string id answered back; a longer one is refused (it would be echoed in every answer)."""

HTTP_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
"""The HTTP status of a JSON-RPC error, as the SDK's servers answer it (others: 200)."""


class JsonRpcError(Exception):
    """A protocol-level error: answered as a JSON-RPC error object, never as a tool result."""

    def __init__(
        self, code: int, message: str, *, id: int | str | None = None, data: Any = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id
        self.data = data
        self.status = status if status is not None else HTTP_STATUS.get(code, 200)


@dataclass(frozen=True, slots=True)
class Message:
    method: str
    params: dict[str, Any]
    id: int | str | None
    """``None``: a notification (no ``id`` member), answered ``202`` with no body."""


_decoder = msgspec.json.Decoder()


def read_message(body: bytes, *, max_depth: int) -> Message:
    """The one request or notification ``body`` holds, or ``JsonRpcError``."""
    if not body:
        raise JsonRpcError(PARSE_ERROR, "Parse error: the body is empty.")
    problem = json_document_problem(body, max_depth=max_depth)
    if problem is not None:
        raise JsonRpcError(INVALID_REQUEST, f"Invalid request: {problem}.")
    try:
        document = _decoder.decode(body)
    except msgspec.DecodeError:
        raise JsonRpcError(PARSE_ERROR, "Parse error: the body is not valid JSON.") from None
    if isinstance(document, list):
        raise JsonRpcError(INVALID_REQUEST, "Invalid request: batches are not accepted; send one request per POST.")
    if not isinstance(document, dict):
        raise JsonRpcError(INVALID_REQUEST, "Invalid request: the body must be one JSON-RPC request object.")
    request_id = _request_id(document)
    if document.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0".', id=request_id)
    if "result" in document or "error" in document:
        raise JsonRpcError(INVALID_REQUEST, "Invalid request: this server sends no requests to answer.", id=request_id)
    method = document.get("method")
    if not isinstance(method, str) or not method:
        raise JsonRpcError(INVALID_REQUEST, 'Invalid request: "method" must be a non-empty string.', id=request_id)
    params = document.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise JsonRpcError(INVALID_PARAMS, 'Invalid params: "params" must be an object.', id=request_id)
    unknown = set(document) - {"jsonrpc", "id", "method", "params"}
    if unknown:
        raise JsonRpcError(INVALID_REQUEST, "Invalid request: unknown members in the envelope.", id=request_id)
    return Message(method=method, params=params, id=request_id)


def _request_id(document: dict[str, Any]) -> int | str | None:
    """The request's id: a string or an integer (JSON-RPC 2.0 as MCP narrows it); absent for a
    notification. Any other id (null, a number with a fraction, a bool, an object, a long
    string) is refused, answered with id null."""
    if "id" not in document:
        return None
    value = document["id"]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise JsonRpcError(INVALID_REQUEST, "Invalid request: the id must be a string or an integer.")
    if isinstance(value, str) and (not value or len(value) > MAX_ID_LENGTH):
        raise JsonRpcError(INVALID_REQUEST, f"Invalid request: a string id holds 1 to {MAX_ID_LENGTH} characters.")
    if isinstance(value, int) and not -(2**53) < value < 2**53:
        raise JsonRpcError(INVALID_REQUEST, "Invalid request: an integer id must be within +-2^53.")
    return value
