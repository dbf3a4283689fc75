"""HTTP/1.1 of an HTTP tool's exchange: what is sent is checked, what a hostile service answers
is parsed strictly, and nothing after an answer becomes part of it."""

from __future__ import annotations

import tracemalloc

import httpcore
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tools.http1 import FRAMING_PER_BODY_BYTE, MAX_HEAD_BYTES, ResponseReader, encode_request

HOST = (b"host", b"orders.internal:8080")


def read(*chunks: bytes, end: bool = False) -> ResponseReader:
    reader = ResponseReader()
    for chunk in chunks:
        reader.feed(chunk)
    if end:
        reader.end_of_stream()
    return reader


def refused(*chunks: bytes, end: bool = False) -> str:
    with pytest.raises(httpcore.RemoteProtocolError) as info:
        read(*chunks, end=end)
    return str(info.value)


# --- the request


def test_a_request_is_encoded_with_its_headers_and_body_in_order() -> None:
    data = encode_request(b"POST", b"/api/orders?x=1", [HOST, (b"content-length", b"2")], b"{}")
    assert data == b"POST /api/orders?x=1 HTTP/1.1\r\nhost: orders.internal:8080\r\ncontent-length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    ("method", "target", "headers", "body"),
    [
        (b"GET", b"/a", [HOST, (b"x-id", b"1\r\nx-admin: yes")], None),  # a header smuggled in a value
        (b"GET", b"/a", [HOST, (b"x-id", b"1\nx")], None),
        (b"GET", b"/a", [HOST, (b"x-id", b"a\x00b")], None),
        (b"GET", b"/a", [HOST, (b"x-id", b" padded")], None),
        (b"GET", b"/a", [HOST, (b"x id", b"1")], None),
        (b"GET", b"/a", [HOST, (b"", b"1")], None),
        (b"GET", b"/a b", [HOST], None),
        (b"GET", b"/a\r\nx: y", [HOST], None),
        (b"GET", b"a", [HOST], None),
        (b"GE T", b"/a", [HOST], None),
        (b"GET", b"/a", [], None),  # no Host
        (b"GET", b"/a", [HOST, HOST], None),
        (b"POST", b"/a", [HOST], b"{}"),  # a body without its length
        (b"POST", b"/a", [HOST, (b"content-length", b"3")], b"{}"),
        (b"POST", b"/a", [HOST, (b"content-length", b"2"), (b"content-length", b"2")], b"{}"),
        (b"POST", b"/a", [HOST, (b"transfer-encoding", b"chunked")], None),
    ],
)
def test_a_request_that_is_not_valid_http_is_never_sent(method, target, headers, body) -> None:
    with pytest.raises(httpcore.LocalProtocolError):
        encode_request(method, target, headers, body)


@given(st.binary(max_size=40))
def test_no_header_value_that_encodes_can_start_a_line_of_its_own(value: bytes) -> None:
    try:
        data = encode_request(b"GET", b"/a", [HOST, (b"x-v", value)], None)
    except httpcore.LocalProtocolError:
        return
    assert data.count(b"\r\n") == 4 and b"\n" not in value and b"\r" not in value and b"\x00" not in value


# --- the answer


def test_a_whole_answer_is_read_and_its_connection_may_go_on() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Type:  application/json \r\nContent-Length: 2\r\n\r\n{}")
    assert (reader.status, reader.complete, reader.keep_alive()) == (200, True, True)
    assert reader.headers == [(b"content-type", b"application/json"), (b"content-length", b"2")]
    assert bytes(reader.body) == b"{}"


@settings(max_examples=60)
@given(st.lists(st.integers(min_value=1, max_value=120), max_size=8))
def test_an_answer_split_anywhere_reads_the_same(cuts: list[int]) -> None:
    data = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n")
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if a < b]
    reader = read(*chunks)
    assert (reader.status, reader.complete, reader.keep_alive()) == (201, True, True)
    assert bytes(reader.body) == b"abcde"
    assert reader.headers[:2] == [(b"transfer-encoding", b"chunked"), (b"x-a", b"1")]


def test_interim_answers_are_skipped_and_their_headers_dropped() -> None:
    reader = read(b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                  b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
    assert reader.status == 200 and reader.headers == [(b"content-length", b"1")] and reader.complete


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"HTTP/1.1 199 Odd\r\nContent-Length: 5\r\n\r\nhello",  # a 1xx with a body
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: a\r\n folded\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
        b"HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS where HTTP was expected
        b"<html>hello</html>",
    ],
)
def test_an_answer_that_is_not_strict_http_is_refused(data: bytes) -> None:
    refused(data)


def test_a_head_past_its_limit_is_refused_even_fed_in_small_pieces() -> None:
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(httpcore.RemoteProtocolError, match="too long a head"):
        for _ in range(MAX_HEAD_BYTES // 1000 + 2):
            reader.feed(b"X-Pad: " + b"p" * 991 + b"\r\n")


def test_endless_interim_answers_are_bounded_by_the_head_limit() -> None:
    reader = ResponseReader()
    with pytest.raises(httpcore.RemoteProtocolError, match="too long a head"):
        for _ in range(MAX_HEAD_BYTES // 25 + 2):
            reader.feed(b"HTTP/1.1 100 Continue\r\n\r\n")


def test_a_second_answer_in_the_same_bytes_is_not_mixed_into_the_first() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nmine"
                  b"HTTP/1.1 200 OK\r\nX-Theirs: 1\r\nContent-Length: 6\r\n\r\ntheirs")
    assert bytes(reader.body) == b"mine" and reader.headers == [(b"content-length", b"4")]
    assert reader.complete and reader.spilled and not reader.keep_alive()


@pytest.mark.parametrize("extra", [b"garbage", b"\x00\x01", b"HTTP/1.1 2"])
def test_bytes_after_a_whole_answer_leave_it_standing_and_the_connection_unused(extra: bytes) -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + extra)
    assert reader.status == 200 and bytes(reader.body) == b"ok"
    assert reader.spilled and not reader.keep_alive()


def test_bytes_in_a_later_read_after_a_whole_answer_are_not_parsed() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"HTTP/1.1 500 Oops\r\n\r\n")
    assert reader.status == 200 and reader.spilled and not reader.keep_alive()


def test_a_body_longer_than_its_length_is_cut_there() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert bytes(reader.body) == b"ok" and reader.spilled


def test_a_body_that_runs_to_the_end_of_the_connection_completes_there_and_ends_it() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\n\r\npart one, ", b"part two", end=True)
    assert bytes(reader.body) == b"part one, part two" and reader.complete and not reader.keep_alive()


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ((), "without sending a response"),
        ((b"HTTP/1.1 200 OK\r\nContent-",), "mid-answer"),
        ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",), "mid-answer"),
        ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",), "mid-answer"),
        ((b"HTTP/1.1 100 Continue\r\n\r\n",), "mid-answer"),
    ],
)
def test_a_connection_that_ends_before_the_answer_does_is_refused(chunks: tuple[bytes, ...], message: str) -> None:
    assert message in refused(*chunks, end=True)


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
def test_an_answer_that_ends_its_connection_is_read_and_the_connection_not_kept(data: bytes) -> None:
    reader = read(data)
    assert reader.complete and bytes(reader.body) == b"ok" and not reader.keep_alive()


@pytest.mark.parametrize("status", [204, 304])
def test_answers_without_a_body_complete_at_their_head(status: int) -> None:
    reader = read(b"HTTP/1.1 %d X\r\n\r\n" % status)
    assert reader.complete and reader.body == b"" and reader.keep_alive()


def test_trailers_are_read_and_dropped_never_taken_for_headers() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
                  b"Content-Encoding: gzip\r\nRetry-After: 1\r\n\r\n")
    assert reader.complete and bytes(reader.body) == b"ok" and reader.keep_alive()
    assert reader.headers == [(b"transfer-encoding", b"chunked")]


@pytest.mark.parametrize(
    ("start", "piece"),
    [
        (b"2\r\nok\r\n0\r\n", b"X-Trailer: yyyyyyyy\r\n"),  # trailers without end
        (b"2\r\nok\r\n0\r\nX-Trailer: ", b"y" * 64),  # one trailer without end
        (b"1;a=", b"b" * 64),  # a chunk extension without end
        (b"", b"0" * 64),  # a chunk size of zeros without end
    ],
)
def test_what_frames_a_body_without_end_is_refused_within_the_head_limit(start: bytes, piece: bytes) -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + start)
    fed = 0
    with pytest.raises(httpcore.RemoteProtocolError):
        while fed < 4 * MAX_HEAD_BYTES:
            reader.feed(piece * 64)
            fed += len(piece) * 64
    assert fed <= MAX_HEAD_BYTES + len(piece) * 64
    assert len(reader.headers) == 1


def test_a_body_of_many_small_chunks_is_read_whole() -> None:
    chunks = b"1\r\nx\r\n" * 100_000
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    reader = read(*(data[i:i + 65536] for i in range(0, len(data), 65536)))
    assert reader.complete and len(reader.body) == 100_000


def test_two_transfer_encoding_lines_are_refused() -> None:
    refused(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")


def test_an_http_1_0_answer_never_keeps_its_connection_whatever_it_says() -> None:
    reader = read(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
    assert reader.complete and not reader.keep_alive()


def test_a_switch_of_protocols_after_a_whole_answer_leaves_the_answer_standing() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                  b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n")
    assert reader.status == 200 and bytes(reader.body) == b"ok" and not reader.keep_alive()


def test_a_body_of_one_byte_chunks_takes_memory_of_its_size_not_of_its_pieces() -> None:
    tracemalloc.start()
    try:
        reader = read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"1\r\nx\r\n" * 10_000
        for _ in range(20):
            reader.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(reader.body) == 200_000
    assert peak < 4 * 200_000


def test_long_extensions_on_one_byte_chunks_cannot_keep_a_call_reading() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"1;e=" + b"a" * 60_000 + b"\r\nx\r\n"  # progress in every read, 60 KB of framing a byte
    fed = 0
    with pytest.raises(httpcore.RemoteProtocolError, match="too many bytes"):
        while fed < 100 * len(chunk):
            reader.feed(chunk)
            fed += len(chunk)
    assert fed <= MAX_HEAD_BYTES + FRAMING_PER_BODY_BYTE * len(reader.body) + len(chunk)
