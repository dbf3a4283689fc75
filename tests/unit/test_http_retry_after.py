"""A business service's ``Retry-After`` reaches the model only as a short count of seconds:
whatever else a hostile service sends there still makes the call a ``RATE_LIMITED`` refusal."""

from __future__ import annotations

import pytest

from gateway.errors import ERRORS, ErrorCode, ToolError
from tests.support.raw_service import call_answered_with

REFUSED = ERRORS[ErrorCode.RATE_LIMITED].message


async def refusal_for(retry_after: bytes, *, status: bytes = b"429 Too Many", encoding: bytes = b"") -> ToolError:
    extra = b"content-encoding: " + encoding + b"\r\n" if encoding else b""
    with pytest.raises(ToolError) as refused:
        await call_answered_with(b"HTTP/1.1 " + status + b"\r\nretry-after: " + retry_after + b"\r\n" + extra
                                 + b"content-length: 2\r\n\r\n{}")
    return refused.value


@pytest.mark.parametrize("retry_after", [b"\xb2", b"\xb9\xb3", b"1" * 5000, b"9" * 4000, b"-1", b"1.5", b""])
async def test_a_retry_after_that_is_not_a_short_count_of_seconds_is_left_out(retry_after: bytes):
    refusal = await refusal_for(retry_after)
    assert refusal.code is ErrorCode.RATE_LIMITED
    assert refusal.message == REFUSED


async def test_a_short_count_of_seconds_is_passed_on():
    refusal = await refusal_for(b"120")
    assert (refusal.code, refusal.message) == (ErrorCode.RATE_LIMITED, f"{REFUSED} Retry after 120 s.")


@pytest.mark.parametrize(("status", "code", "retryable"), [
    (b"429 Too Many", ErrorCode.RATE_LIMITED, True),
    (b"503 Unavailable", ErrorCode.TOOL_EXECUTION_FAILED, True),
    (b"404 Not Found", ErrorCode.NOT_FOUND, False),
])
async def test_a_refusal_with_a_compressed_body_keeps_the_meaning_of_its_status(status, code, retryable):
    """A review's find: a compressed error body made every refusal a non-retryable
    TOOL_EXECUTION_FAILED, losing a 503's retry and a 429's Retry-After. The body stays unread."""
    refusal = await refusal_for(b"30", status=status, encoding=b"gzip")
    assert refusal.code is code
    assert (ERRORS[code].retryable if refusal.retryable is None else refusal.retryable) is retryable
    if code is ErrorCode.RATE_LIMITED:
        assert refusal.message == f"{REFUSED} Retry after 30 s."
