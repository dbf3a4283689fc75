"""A model provider's answer is read as sent: the gateway asks for identity, and a compressed
answer is ``UPSTREAM_BAD_RESPONSE`` for that run, never inflated past the response limit."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest

from tests.support.scripted_model import Turn, openai_turn


def zeros(size: int, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    chunk = bytes(1024 * 1024)
    return b"".join(compressor.compress(chunk) for _ in range(size // len(chunk))) + compressor.flush()


@pytest.mark.parametrize(
    ("encoding", "wbits"), [("gzip", 16 + zlib.MAX_WBITS), ("deflate", zlib.MAX_WBITS)], ids=["gzip", "deflate"]
)
async def test_a_compressed_answer_is_upstream_bad_response_without_being_inflated(
    gateway, model, encoding: str, wbits: int
):
    bomb = zeros(100 * 1024 * 1024, wbits)  # 100 MB of zeros in about 100 KB
    model.script(Turn(body=bomb, headers={"content-encoding": encoding}))
    tracemalloc.start()
    try:
        response = await gateway.chat("hello")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "UPSTREAM_BAD_RESPONSE"
    assert model.served == 1  # the same request would get the same answer: not retried
    assert model.headers[0]["accept-encoding"] == "identity"
    print("PEAK", peak); assert peak < 16 * 1024 * 1024, peak
    model.script(openai_turn("plain again"))
    ok = await gateway.chat("hello")
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"] == "plain again"
