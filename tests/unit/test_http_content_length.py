"""A business service's `Content-Length` is only reported, never trusted to be a short number:
thousands of leading zeros (which the parser accepts) or digits past what `int` takes leave a
truncated answer truncated, not a call that failed after the service acted."""

from __future__ import annotations

import pytest

from gateway.tools.base import PartialResult
from tests.support.raw_service import call_answered_with

BODY = b"x" * 20_000
LIMIT = 1000


async def answer_to(content_length: bytes) -> object:
    return await call_answered_with(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: " + content_length + b"\r\n\r\n" + BODY,
        max_result_bytes=LIMIT, method="POST", mutates=True,
    )


@pytest.mark.parametrize(
    ("content_length", "reported"),
    [(b"20000", 20_000), (b"0" * 4400 + b"20000", 20_000), (b"0" * 20 + b"20000", 20_000)],
    ids=["plain", "4400-leading-zeros", "20-leading-zeros"],
)
async def test_an_answer_past_the_limit_is_cut_with_its_length_however_many_zeros_lead_it(content_length, reported):
    answer = await answer_to(content_length)
    assert isinstance(answer, PartialResult)
    assert answer.kept == BODY[:LIMIT] and answer.original_bytes == reported
