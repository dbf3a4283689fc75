"""The ``content`` of a ``role=tool`` message: a JSON string the model can act on.

``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code", "message", "retryable", "approval_id"?, "error_id"?}}``.
"""

from __future__ import annotations

import msgspec

from gateway.errors import ERRORS, ErrorCode
from gateway.tools.base import PartialResult

TRUNCATION_MARKER = "…[truncated]"


class ErrorDetail(msgspec.Struct, omit_defaults=True):
    code: str
    message: str
    retryable: bool
    approval_id: str | None = None
    error_id: str | None = None


class ErrorContent(msgspec.Struct):
    ok: bool
    error: ErrorDetail


class TruncatedResult(msgspec.Struct, omit_defaults=True):
    ok: bool
    result: str
    truncated: bool
    original_bytes: int | None = None
    """Left out when the original size is not known (a body that was not read to its end)."""


_encoder = msgspec.json.Encoder()


def ok_content(result_json: bytes) -> str:
    return (b'{"ok":true,"result":' + result_json + b"}").decode()


def error_content(
    code: ErrorCode,
    message: str | None = None,
    *,
    retryable: bool | None = None,
    approval_id: str | None = None,
    error_id: str | None = None,
) -> str:
    spec = ERRORS[code]
    detail = ErrorDetail(
        code=code.value,
        message=message or spec.message,
        retryable=spec.retryable if retryable is None else retryable,
        approval_id=approval_id,
        error_id=error_id,
    )
    return _encoder.encode(ErrorContent(ok=False, error=detail)).decode()


def encode_result(result: object, *, max_bytes: int) -> str:
    """Encode a tool's result; one larger than ``max_bytes`` is cut, visibly, with its original size."""
    if isinstance(result, PartialResult):
        return _truncated(result.kept[:max_bytes], result.original_bytes)
    encoded = _encoder.encode(result)
    if len(encoded) <= max_bytes:
        return ok_content(encoded)
    return _truncated(encoded[:max_bytes], len(encoded))


def _truncated(kept: bytes, original_bytes: int | None) -> str:
    text = kept.decode("utf-8", errors="ignore")
    return _encoder.encode(
        TruncatedResult(ok=True, result=text + TRUNCATION_MARKER, truncated=True, original_bytes=original_bytes)
    ).decode()


# Outcomes the ledger decides without running anything always read the same.
LEDGER_CONTENTS: dict[str, str] = {
    code.value: error_content(code)
    for code in (ErrorCode.RUN_EXPIRED, ErrorCode.BUDGET_EXCEEDED, ErrorCode.REPEATED_CALL, ErrorCode.TOOL_CALL_ID_CONFLICT)
}
TOOL_BUDGET_EXCEEDED = "TOOL_BUDGET_EXCEEDED"
"""The key of the content answered when a tool's own per-run cap is used up (code BUDGET_EXCEEDED)."""
LEDGER_CONTENTS[TOOL_BUDGET_EXCEEDED] = error_content(
    ErrorCode.BUDGET_EXCEEDED, "This tool's call limit for this run is used up."
)
