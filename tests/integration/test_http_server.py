"""The protocol `gateway serve` runs (gateway.http_server) on a real uvicorn server and a
real socket, on uvloop and on asyncio's loop: each small response leaves in one write of
the socket's transport, and nothing else changes — bodies large and streamed arrive whole
and in order, pipelined requests are answered in turn, a client that stops reading holds
the app back instead of filling the server's memory, `Connection: close` delivers the whole
body before the end, and a client that leaves mid-body harms nobody else."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

import json

from gateway import http_server
from gateway.http_server import FLUSH_AT_BYTES, CoalescingHttpToolsProtocol
from tests.support.loopback import loopback_socket

BIG = 1024 * 1024
CHUNK = 16 * 1024


class WriteLog:
    """The writes that reached the socket's transports, per connection."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []


class CountedWrites:
    """The socket's transport, recording each write it is given."""

    def __init__(self, transport: Any, log: WriteLog) -> None:
        self._transport = transport
        self._log = log

    def write(self, data: bytes) -> None:
        self._log.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


LOG = WriteLog()


class CountingProtocol(CoalescingHttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:
        super().connection_made(CountedWrites(transport, LOG))


class App:
    """Small, large and streamed answers; ``sent`` counts the bytes a body handed to send."""

    def __init__(self) -> None:
        self.sent = 0
        self.proceed = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/small":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"5")]})
            await send({"type": "http.response.body", "body": b"hello"})
        elif path == "/big":
            # Sent without yielding between chunks: all of it within one turn of the loop.
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(BIG).encode())]})
            for i in range(BIG // CHUNK):
                await send({"type": "http.response.body", "body": bytes([i % 256]) * CHUNK, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
            # The client reads the first part before the second is sent: nothing is held back.
            while not self.proceed.is_set():
                await asyncio.sleep(0.005)
            await send({"type": "http.response.body", "body": b"second\n"})
        elif path == "/slow":
            await asyncio.sleep(1.5)  # longer than the head and body deadlines of ``head_limits``
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"4")]})
            await send({"type": "http.response.body", "body": b"slow"})
        elif path == "/echo":
            size, more = 0, True
            while more:
                message = await receive()
                size += len(message.get("body", b""))
                more = message.get("more_body", False)
            body = str(size).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        elif path == "/flood":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            # 32 MiB in 1 KiB chunks, without yielding unless uvicorn waits for the client:
            # what the transport holds grows only until it is handed on at FLUSH_AT_BYTES.
            for _ in range(32 * 1024):
                await send({"type": "http.response.body", "body": b"f" * 1024, "more_body": True})
                self.sent += 1024
            await send({"type": "http.response.body", "body": b""})


class Server:
    def __init__(self, loop: str) -> None:
        self.app = App()
        self.sock = loopback_socket()
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(self.app, loop=loop, http=CountingProtocol, lifespan="on", log_config=None,
                                access_log=False, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()

    def connect(self) -> socket.socket:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client


@pytest.fixture(params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    LOG.writes.clear()
    with Server(request.param) as running:
        yield running


def read_response(client: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """One response with a content-length from ``client``; what follows stays in ``buffer``."""
    while b"\r\n\r\n" not in buffer:
        chunk = client.recv(65536)
        assert chunk, "the connection ended inside the head"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = client.recv(65536)
        assert chunk, "the connection ended inside the body"
        body += chunk
    buffer[:] = body[length:]
    return head, bytes(body[:length])


def read_to_end(client: socket.socket) -> bytes:
    data = bytearray()
    while chunk := client.recv(65536):
        data += chunk
    return bytes(data)


def test_a_small_response_leaves_in_one_write(server):
    with server.connect() as client:
        buffer = bytearray()
        for _ in range(5):
            client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
            head, body = read_response(client, buffer)
            assert head.startswith(b"HTTP/1.1 200") and body == b"hello"
    assert len(LOG.writes) == 5
    assert all(write.startswith(b"HTTP/1.1 200") and write.endswith(b"\r\n\r\nhello") for write in LOG.writes)


def test_pipelined_requests_are_answered_in_turn(server):
    with server.connect() as client:
        client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n" * 3)
        buffer = bytearray()
        answers = [read_response(client, buffer) for _ in range(3)]
    assert [body for _, body in answers] == [b"hello"] * 3
    assert buffer == b""


def test_a_large_body_sent_in_one_turn_arrives_whole_in_bounded_writes(server):
    with server.connect() as client:
        client.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        _, body = read_response(client, bytearray())
    assert body == b"".join(bytes([i % 256]) * CHUNK for i in range(BIG // CHUNK))
    # Handed on as it grows, not held until the turn ends: the transport's flow control sees it.
    assert max(len(write) for write in LOG.writes) < FLUSH_AT_BYTES + CHUNK + 1024 < BIG // 4


def test_a_streamed_part_is_sent_before_the_next_is_made(server):
    with server.connect() as client:
        client.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        received = bytearray()
        while b"first\n" not in received:
            chunk = client.recv(65536)
            assert chunk, "the first part never came"
            received += chunk
        assert b"second" not in received
        server.app.proceed.set()
        received += read_to_end(client)
    assert received.endswith(b"second\n\r\n0\r\n\r\n")


def test_connection_close_delivers_the_whole_body_then_ends(server):
    with server.connect() as client:
        client.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = read_to_end(client)
    assert len(data.partition(b"\r\n\r\n")[2]) == BIG


def test_a_client_that_stops_reading_holds_the_app_back(server):
    with server.connect() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        client.sendall(b"GET /flood HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        time.sleep(1.0)
        held_back_at = server.app.sent
        received = len(read_to_end(client))
    # Kernel buffers on both ends take a few MiB; the app must not have run ahead by all 32.
    assert held_back_at < 16 * 1024 * 1024
    assert received > 32 * 1024 * 1024


def test_a_client_that_ends_its_side_after_its_request_still_reads_an_answer_made_at_once(server):
    # As uvicorn delivers it without the wrapper: an answer made while the EOF is handled
    # goes out; one still being made then is lost either way (uvicorn closes on EOF).
    for _ in range(50):
        with server.connect() as client:
            client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
            client.shutdown(socket.SHUT_WR)
            data = read_to_end(client)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\nhello"), data


def test_a_client_that_leaves_mid_body_harms_no_other(server):
    leaving = server.connect()
    leaving.sendall(b"GET /flood HTTP/1.1\r\nhost: x\r\n\r\n")
    leaving.recv(1000)
    leaving.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    leaving.close()  # a reset, mid-body
    with server.connect() as client:
        client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
        _, body = read_response(client, bytearray())
    assert body == b"hello"


def test_gateway_serve_answers_through_this_protocol():
    from gateway.cli import _http_protocol

    assert _http_protocol() is CoalescingHttpToolsProtocol


@pytest.fixture
def head_limits() -> Iterator[None]:
    http_server.configure(max_head_bytes=4096, head_timeout_s=0.5, body_timeout_s=1.0)
    try:
        yield
    finally:
        http_server.configure(max_head_bytes=65_536, head_timeout_s=20.0, body_timeout_s=60.0)


def _refusal(answer: bytes) -> tuple[bytes, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return head.split(b"\r\n")[0], json.loads(body)


def test_a_head_past_the_limit_is_431_and_the_connection_closed(server, head_limits):
    with server.connect() as client:
        client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 10_000)
        status, body = _refusal(read_to_end(client))
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert body["error"]["code"] == "HEADERS_TOO_LARGE"
    # An endless header costs the server only what the limit lets in.
    with server.connect() as client:
        sent = 0
        with pytest.raises(OSError):
            client.sendall(b"GET /small HTTP/1.1\r\nx-a: ")
            for _ in range(100_000):  # 1 GB, were it all taken
                client.sendall(b"a" * 10_000)
                sent += 10_000
    assert sent < 64 * 2**20


def test_a_head_under_the_limit_with_a_body_in_the_same_write_is_served(server, head_limits):
    head = b"POST /echo HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 3_500 + b"\r\ncontent-length: 200000\r\n\r\n"
    with server.connect() as client:
        buffer = bytearray()
        for _ in range(3):  # the next request's head is counted from its own start
            client.sendall(head + b"b" * 200_000)
            answer, body = read_response(client, buffer)
            assert answer.startswith(b"HTTP/1.1 200") and body == b"200000"


def test_a_head_not_complete_in_time_is_408_and_a_silent_connection_is_closed(server, head_limits):
    with server.connect() as client:
        client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n")
        # (Within the socket's 10 s timeout: the head's deadline is 0.5 s.)
        status, body = _refusal(read_to_end(client))
    assert status == b"HTTP/1.1 408 Request Timeout" and body["error"]["code"] == "INVALID_REQUEST"
    with server.connect() as client:
        assert read_to_end(client) == b""
    # A request sent at once is served, as before.
    with server.connect() as client:
        client.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_response(client, bytearray())[1] == b"hello"


def test_pipelined_requests_are_counted_each_on_its_own(server, head_limits):
    request = b"GET /small HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 900 + b"\r\n\r\n"
    with server.connect() as client:
        client.sendall(request * 100)  # 95 KB in one write: far past the limit together, each far under it
        buffer = bytearray()
        answers = [read_response(client, buffer) for _ in range(100)]
    assert [body for _, body in answers] == [b"hello"] * 100


def test_a_request_answered_before_its_body_came_is_closed_at_the_bodys_deadline(server, head_limits):
    with server.connect() as client:
        client.sendall(b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000000\r\n\r\nb")
        head, body = read_response(client, bytearray())
        assert head.startswith(b"HTTP/1.1 200") and body == b"hello"
        _drip_until_closed(client)
        assert _closed_without_an_answer(client)


def test_a_body_that_does_not_arrive_in_time_has_its_connection_closed(server, head_limits):
    with server.connect() as client:
        client.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        _drip_until_closed(client)
        # (The app, reading the body, heard that its client left; nothing was answered.)
        assert _closed_without_an_answer(client)


def _drip_until_closed(client: socket.socket) -> None:
    """A body byte every 0.2 s (each puts off any idle timeout) until the server closes, at most 4 s."""
    for _ in range(20):
        try:
            client.sendall(b"b")
        except OSError:
            return
        time.sleep(0.2)
    raise AssertionError("the connection was still open after 4 s of a 1 s body deadline")


def _closed_without_an_answer(client: socket.socket) -> bool:
    try:
        return read_to_end(client) == b""
    except ConnectionResetError:  # closed with data unread: the peer resets
        return True


POST_5 = b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n"
POST_CHUNKED = b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
BIG_HEAD = b"GET /small HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 10_000


@pytest.mark.parametrize(
    ("head", "rest", "refused"),
    [(POST_5, b"hello" + b"GET /small HTTP/1.1\r\nx-a: b", b"HTTP/1.1 408 Request Timeout"),  # never ends
     (POST_5, b"hello" + BIG_HEAD + b"\r\n\r\n", b"HTTP/1.1 431 Request Header Fields Too Large"),  # whole
     (POST_5, b"hello" + BIG_HEAD, b"HTTP/1.1 431 Request Header Fields Too Large"),  # a header left open
     (POST_CHUNKED, b"5\r\nhello\r\n0\r\n\r\n" + BIG_HEAD, b"HTTP/1.1 431 Request Header Fields Too Large")],
    ids=["late", "too-large", "too-large-and-open", "too-large-after-a-chunked-body"],
)
def test_a_head_begun_in_the_write_that_ends_a_body_has_its_deadline_and_its_limit(
    server, head_limits, head, rest, refused
):
    with server.connect() as client:
        client.sendall(head)
        time.sleep(0.2)
        client.sendall(rest)  # the body's end and the next head, in one write
        buffer = bytearray()
        assert read_response(client, buffer)[1] == b"5"
        started = time.monotonic()
        status, _ = _refusal(bytes(buffer) + read_to_end(client))
    assert status == refused and time.monotonic() - started < 5


def test_a_connection_answered_before_its_body_ended_is_closed_when_idle(server, head_limits):
    with server.connect() as client:
        client.sendall(b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nbody")
        assert read_response(client, bytearray())[1] == b"hello"
        time.sleep(0.2)
        client.sendall(b"y")  # the body's last byte: after it, nothing
        started = time.monotonic()
        assert _closed_without_an_answer(client)
    assert time.monotonic() - started < 5  # the head's deadline (0.5 s), not the socket's 10 s


@pytest.mark.parametrize(
    ("following", "refused"),
    [(b"GET /small HTTP/1.1\r\nhost: x\r\n", b"HTTP/1.1 408 Request Timeout"),
     (b"GET /small HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 10_000, b"HTTP/1.1 431 Request Header Fields Too Large")],
    ids=["head-late", "head-too-large"],
)
def test_a_refused_head_is_answered_after_the_requests_before_it(server, head_limits, following, refused):
    # The request before may have run already: its answer is not cut off, nor replaced by the refusal.
    with server.connect() as client:
        client.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(0.05)
        client.sendall(following)
        buffer = bytearray()
        head, body = read_response(client, buffer)
        assert head.startswith(b"HTTP/1.1 200") and body == b"slow"
        status, _ = _refusal(bytes(buffer) + read_to_end(client))
    assert status == refused


def test_a_body_waiting_behind_a_pipelined_request_gets_its_deadline_once_it_may_be_read(server, head_limits):
    with server.connect() as client:
        client.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n"
                       b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
        buffer = bytearray()
        assert read_response(client, buffer)[1] == b"slow"  # 1.5 s: past the 1 s body deadline
        time.sleep(0.6)  # within a whole deadline from the moment the body may be read
        client.sendall(b"hello")
        assert read_response(client, buffer)[1] == b"5"
