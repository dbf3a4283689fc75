"""The ``content`` of a ``role=tool`` message: a JSON string the model can act on.

``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code", "message", "retryable", "approval_id"?, "error_id"?}}``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.errors import ERRORS, ErrorCode


class ErrorDetail(msgspec.Struct, omit_defaults=True, frozen=True):
    code: str
    message: str
    retryable: bool
    approval_id: str | None = None
    error_id: str | None = None


class ErrorContent(msgspec.Struct):
    ok: bool
    error: ErrorDetail


_encoder = msgspec.json.Encoder()


def ok_content(result_json: bytes) -> str:
    return (b'{"ok":true,"result":' + result_json + b"}").decode()


def error_detail(
    code: ErrorCode,
    message: str | None = None,
    *,
    retryable: bool | None = None,
    approval_id: str | None = None,
    error_id: str | None = None,
) -> ErrorDetail:
    spec = ERRORS[code]
    return ErrorDetail(
        code=code.value,
        message=message or spec.message,
        retryable=spec.retryable if retryable is None else retryable,
        approval_id=approval_id,
        error_id=error_id,
    )


def detail_content(detail: ErrorDetail) -> str:
    return _encoder.encode(ErrorContent(ok=False, error=detail)).decode()


def error_content(
    code: ErrorCode,
    message: str | None = None,
    *,
    retryable: bool | None = None,
    approval_id: str | None = None,
    error_id: str | None = None,
) -> str:
    return detail_content(error_detail(code, message, retryable=retryable, approval_id=approval_id, error_id=error_id))


class StoredContent(msgspec.Struct):
    """A ``content`` read back from storage (a replayed call, an approval's outcome)."""

    ok: bool
    result: Any = None
    truncated: bool = False
    original_bytes: int | None = None
    error: ErrorDetail | None = None


_stored = msgspec.json.Decoder(StoredContent)


def read_content(content: str) -> StoredContent:
    """The one reader of what this module writes, for content that comes back from storage."""
    return _stored.decode(content)
