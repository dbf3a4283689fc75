"""Services that break HTTP/1.1 on purpose, against the transport HTTP tools, model providers
and the JWKS fetch share. Whatever a service sends, each call gets its own answer or an
error, never bytes of another call; a connection with anything left over is not reused.

Every test runs both ways through the pool: httpx's requests (model providers, the JWKS fetch)
and ``ServicePool.exchange`` (HTTP tools).

Every server here is a raw asyncio server on a loopback port: it answers each request with
``own:<path>``, so a call can tell its answer from another's, and misbehaves as a test says.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from types import SimpleNamespace

import httpcore

from gateway.tools.http_transport import (
    PARTITION,
    EncodedBody,
    ServiceCall,
    pool_of,
    read_capped,
    service_transport,
)
from tests.support.tls import client_context, server_context

Misbehave = Callable[[int, bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
"""Called with the request's number on its connection (1, 2, ...), its path, and the streams;
returns True when it answered the request itself, False to let the server answer normally."""


def answer(body: bytes, *extra_headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra_headers) + b"\r\n" + body


class HostileServer:
    def __init__(self, misbehave: Misbehave | None = None) -> None:
        self.misbehave = misbehave
        self.accepted = 0
        self.paths: list[bytes] = []
        self.done_misbehaving = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self, tls: ssl.SSLContext | None = None) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        scheme = "https" if tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        number = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                number += 1
                path = head.split(b" ", 2)[1]
                self.paths.append(path)
                if self.misbehave is not None and await self.misbehave(number, path, reader, writer):
                    continue
                length = next((int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(answer(b"own:" + path))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return
        except asyncio.CancelledError:
            return  # stopped by the test: nothing waits for this task's outcome
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks)
        await self._server.wait_closed()


@pytest.fixture
async def hostile() -> AsyncIterator[Callable[[Misbehave | None], Awaitable[tuple[HostileServer, str]]]]:
    servers: list[HostileServer] = []

    async def start(misbehave: Misbehave | None) -> tuple[HostileServer, str]:
        server = HostileServer(misbehave)
        servers.append(server)
        return server, await server.start()

    yield start
    for server in servers:
        await server.stop()


LIMITS = httpx.Limits(max_connections=10, max_keepalive_connections=10)


def service_call(url: str, *, method: bytes = b"GET", body: bytes | None = None, partition: object = None,
                 timeout: float = 5.0, limit: int = 1024 * 1024, error_limit: int = 4096) -> ServiceCall:
    """What an HTTP tool hands ``ServicePool.exchange`` for ``url`` (asking for identity)."""
    parsed = httpx.URL(url)
    headers = [(b"host", parsed.netloc), (b"accept-encoding", b"identity")]
    if body is not None:
        headers.append((b"content-length", str(len(body)).encode()))
    return ServiceCall(
        scheme=parsed.scheme.encode(), host=parsed.host.encode(), port=parsed.port or 443, target=parsed.raw_path,
        method=method, headers=headers, body=body, partition=partition,
        timeouts={"connect": timeout, "read": timeout, "write": timeout, "pool": timeout},
        limit=limit, error_limit=error_limit,
    )


class ExchangeClient:
    """The HTTP tools' way through the pool (``ServicePool.exchange``), behind the few calls of
    httpx's client these tests make."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._transport = service_transport(limits=LIMITS, ssl_context=tls)
        self._pool = pool_of(self._transport)

    async def __aenter__(self) -> ExchangeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._transport.aclose()

    async def get(self, url: str, extensions: dict | None = None) -> SimpleNamespace:
        return await self.send(b"GET", url, None, (extensions or {}).get(PARTITION))

    async def post(self, url: str, content: bytes) -> SimpleNamespace:
        return await self.send(b"POST", url, content, None)

    async def send(self, method: bytes, url: str, body: bytes | None, partition: object) -> SimpleNamespace:
        answer = await self._pool.exchange(service_call(url, method=method, body=body, partition=partition))
        assert answer.complete
        return SimpleNamespace(status_code=answer.status, text=answer.body.decode())


@pytest.fixture(params=["httpx", "exchange"])
def client(request: pytest.FixtureRequest) -> Callable[..., object]:
    """Makes a client of the pool, one way or the other: ``client(tls=None)``."""

    def make(tls: ssl.SSLContext | None = None) -> object:
        if request.param == "exchange":
            return ExchangeClient(tls)
        return httpx.AsyncClient(transport=service_transport(limits=LIMITS, ssl_context=tls), timeout=5)

    make.way = request.param  # type: ignore[attr-defined]
    return make


async def own_answer(http: httpx.AsyncClient, url: str, **kwargs: object) -> str:
    response = await http.get(url, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 200
    return response.text


async def test_late_bytes_after_an_answer_never_become_the_next_calls_answer(hostile, client):
    async def late_second_answer(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(answer(b"own:" + path))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(answer(b"stale:" + path))
        await writer.drain()
        server.done_misbehaving.set()
        return True

    server, base = await hostile(late_second_answer)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme"
        await server.done_misbehaving.wait()
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
        assert await own_answer(http, f"{base}/globex-again") == "own:/globex-again"
    assert server.accepted == 2  # the connection with the late bytes was closed, the next one kept


@pytest.mark.parametrize(
    "extra",
    [answer(b"stale:/acme"), b"HTTP/1.1 200 OK\r\n", b"x"],
    ids=["a-second-answer", "half-an-answer", "one-byte"],
)
async def test_extra_bytes_in_the_answers_packet_never_become_the_next_calls_answer(
    hostile, extra: bytes, client
):
    async def extra_in_same_write(number: int, path: bytes, reader, writer) -> bool:
        if number != 1:
            return False
        writer.write(answer(b"own:" + path) + extra)
        await writer.drain()
        return True

    server, base = await hostile(extra_in_same_write)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme"
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_a_body_longer_than_its_content_length_is_cut_there_and_the_rest_is_not_the_next_answer(
    hostile, client
):
    async def too_long(number: int, path: bytes, reader, writer) -> bool:
        if number != 1:
            return False
        body = b"own:" + path
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s-and-acme-bytes-past-the-length"
                     % (len(body), body))
        await writer.drain()
        return True

    server, base = await hostile(too_long)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme"
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_an_answer_before_the_body_was_read_is_that_calls_and_the_body_is_never_answered_to_another(
    hostile, client
):
    """The service answers after the head and reads the unread body as its next request: the
    answer to that smuggled request must not reach the next call."""

    async def answer_without_reading_the_body(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/upload":
            return False
        writer.write(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\n\r\ntoo large")
        await writer.drain()
        return True

    server, base = await hostile(answer_without_reading_the_body)
    smuggled = b"GET /smuggled-acme-request HTTP/1.1\r\nhost: x\r\n\r\n"
    async with client() as http:
        response = await http.post(f"{base}/upload", content=smuggled)
        assert (response.status_code, response.text) == (413, "too large")
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_an_answer_that_arrives_while_the_body_is_still_being_sent_closes_the_connection(
    hostile, client
):
    """The service answers, then reads (and drops) the body it did not wait for: its answer came
    before the request was sent, so nothing says what it reads next on that connection."""
    size = 32 * 1024 * 1024  # more than the sockets' buffers: the client is still writing

    async def answer_then_drain(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/upload":
            return False
        writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 6\r\n\r\nno key")
        await writer.drain()
        await reader.readexactly(size)
        return True

    server, base = await hostile(answer_then_drain)
    async with client() as http:
        response = await http.post(f"{base}/upload", content=b"a" * size)
        assert (response.status_code, response.text) == (401, "no key")
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_a_close_delimited_body_is_read_to_the_end_and_its_connection_is_not_reused(hostile, client):
    async def close_delimited(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nown:/acme, until the connection ends")
        await writer.drain()
        writer.close()
        return True

    server, base = await hostile(close_delimited)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme, until the connection ends"
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_a_chunked_body_with_trailers_is_read_whole_and_the_clean_connection_is_reused(hostile, client):
    async def chunked(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n"
                     b"4\r\nown:\r\n5\r\n/acme\r\n0\r\nx-checksum: 1234\r\n\r\n")
        await writer.drain()
        return True

    server, base = await hostile(chunked)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme"
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 1


async def test_chunked_body_followed_by_extra_bytes_is_not_reused(hostile, client):
    async def chunked_then_more(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\nown:/acme\r\n0\r\n\r\n"
                     + answer(b"stale:/acme"))
        await writer.drain()
        return True

    server, base = await hostile(chunked_then_more)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme"
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_informational_answers_before_the_answer_are_skipped(hostile, client):
    async def informational_first(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n"
                     b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
                     + answer(b"own:/acme"))
        await writer.drain()
        return True

    server, base = await hostile(informational_first)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme") == "own:/acme"
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 1


async def test_a_reset_in_the_middle_of_a_body_fails_that_call_only(hostile, client):
    async def reset_mid_body(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nown:/acme and then")
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST
        return True

    server, base = await hostile(reset_mid_body)
    async with client() as http:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError, httpcore.ReadError,
                            httpcore.RemoteProtocolError)):
            await http.get(f"{base}/acme")
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert server.accepted == 2


async def test_calls_of_two_partitions_never_share_a_connection(hostile, client):
    """No check can tell a late answer that arrives after the next request was sent from that
    request's answer: a service that writes its stale answer before it reads the next request
    would hand it to whoever sent that request. Different callers therefore never share."""

    async def stale_before_reading_on(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(answer(b"own:/acme"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(answer(b"stale:/acme"))
        await writer.drain()
        return True

    server, base = await hostile(stale_before_reading_on)
    async with client() as http:
        assert await own_answer(http, f"{base}/acme", extensions={PARTITION: ("acme", "alice")}) == "own:/acme"
        assert await own_answer(http, f"{base}/globex", extensions={PARTITION: ("globex", "gina")}) == "own:/globex"
    assert server.accepted == 2


async def test_the_same_partition_reuses_a_clean_connection(hostile, client):
    server, base = await hostile(None)
    async with client() as http:
        for path in ("/a", "/b", "/c"):
            assert await own_answer(http, f"{base}{path}", extensions={PARTITION: ("acme", "alice")}) == f"own:{path}"
    assert server.accepted == 1


async def test_httpcore_alone_reuses_a_connection_with_bytes_left_in_h11(hostile):
    """Why the pool checks h11's buffer itself: httpcore 1.0's own pool, with h11, answers the
    next request from bytes that came in the previous answer's packet. If this fails, httpcore
    checks it now, and its pool may be worth another measurement."""

    async def extra_in_same_write(number: int, path: bytes, reader, writer) -> bool:
        if number != 1:
            return False
        writer.write(answer(b"own:" + path) + answer(b"stale:" + path))
        await writer.drain()
        return True

    server, base = await hostile(extra_in_same_write)
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(), timeout=5) as http:
        assert (await http.get(f"{base}/acme")).text == "own:/acme"
        assert (await http.get(f"{base}/globex")).text == "stale:/acme"
    assert server.accepted == 1


def zeros(size: int, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    chunk = bytes(1024 * 1024)
    return b"".join(compressor.compress(chunk) for _ in range(size // len(chunk))) + compressor.flush()


BOMB_SIZE = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """100 MB of zeros, compressed: about 100 KB each."""
    return {"gzip": zeros(BOMB_SIZE, 16 + zlib.MAX_WBITS), "deflate": zeros(BOMB_SIZE, zlib.MAX_WBITS)}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
async def test_a_compressed_body_is_refused_before_a_byte_is_inflated(hostile, bombs, encoding: str, client):
    body = bombs.get(encoding, bombs["gzip"])
    asked: list[bytes] = []

    async def bomb(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/bomb":
            return False
        writer.write(answer(body, b"content-encoding: " + encoding.encode()))
        await writer.drain()
        return True

    server, base = await hostile(bomb)
    async with client() as http:
        if client.way == "exchange":
            with pytest.raises(EncodedBody) as refused:
                await http.get(f"{base}/bomb")  # asks for identity, as HTTP tools do
            assert (refused.value.encoding, refused.value.status) == (encoding, 200)
            asked.append(b"identity")
        else:
            async with http.stream("GET", f"{base}/bomb", headers={"accept-encoding": "identity"}) as response:
                asked.append(response.request.headers["accept-encoding"].encode())
                with pytest.raises(EncodedBody):
                    await read_capped(response, 16 * 1024)
                assert response.num_bytes_downloaded == 0  # refused on its header: nothing read, nothing inflated
        assert await own_answer(http, f"{base}/globex") == "own:/globex"
    assert asked == [b"identity"]
    assert server.accepted == 2  # the refused answer's connection was closed, its body unread


def test_on_uvloop_too_a_call_gets_its_own_answer_and_late_bytes_close_the_connection(client):
    """``gateway serve`` runs on uvloop, whose transports and sockets are its own types."""
    import uvloop

    async def scenario() -> tuple[list[str], int]:
        async def late_second_answer(number: int, path: bytes, reader, writer) -> bool:
            if path != b"/acme":
                return False
            writer.write(answer(b"own:" + path) + answer(b"stale:" + path))
            await writer.drain()
            return True

        server = HostileServer(late_second_answer)
        base = await server.start()
        try:
            async with client() as http:
                texts = [await own_answer(http, f"{base}{path}") for path in ("/acme", "/globex", "/again")]
        finally:
            await server.stop()
        return texts, server.accepted

    texts, accepted = uvloop.run(scenario())
    assert texts == ["own:/acme", "own:/globex", "own:/again"]
    assert accepted == 2


async def test_over_tls_a_clean_connection_is_reused_and_one_with_late_bytes_is_not(client):
    async def extra_after_acme(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/acme":
            return False
        writer.write(answer(b"own:" + path) + answer(b"stale:" + path))
        await writer.drain()
        return True

    server = HostileServer(extra_after_acme)
    base = await server.start(server_context())
    try:
        async with client(client_context()) as http:
            assert await own_answer(http, f"{base}/first") == "own:/first"
            assert await own_answer(http, f"{base}/acme") == "own:/acme"
            assert server.accepted == 1  # the clean connection was reused
            assert await own_answer(http, f"{base}/globex") == "own:/globex"
    finally:
        await server.stop()
    assert server.accepted == 2


async def test_partitions_whose_connections_are_gone_leave_nothing_behind_in_the_pool(hostile, client):
    """Every caller is a partition of its own: the pool must not keep an entry for each one
    it ever served (a process serving many users would grow without bound)."""

    async def close_on_second(number: int, path: bytes, reader, writer) -> bool:
        if number != 2:
            return False
        writer.write(answer(b"own:" + path, b"connection: close"))
        await writer.drain()
        writer.close()
        return True

    _, base = await hostile(close_on_second)
    async with client() as http:
        pool = http._transport._pool  # noqa: SLF001 -- what the pool holds is the point here
        for user in range(20):
            for _ in range(2):  # the second answer closes the connection the first left idle
                partition = {PARTITION: ("acme", f"user-{user}")}
                assert await own_answer(http, f"{base}/u{user}", extensions=partition) == f"own:/u{user}"
        assert pool._idle == {}  # noqa: SLF001


async def test_an_answer_past_the_calls_limit_is_cut_there_and_its_connection_is_not_reused(hostile):
    """HTTP tools read a body up to their result limit and no further: the rest stays unread,
    so the connection holding it is closed, never handed to the next call."""

    async def long_answer(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/long":
            return False
        writer.write(answer(b"own:/long" + b"x" * 200_000))
        await writer.drain()
        return True

    server, base = await hostile(long_answer)
    async with ExchangeClient() as http:
        cut = await http._pool.exchange(  # noqa: SLF001 -- the limit is the point here
            service_call(f"{base}/long", limit=1000, error_limit=100)
        )
        assert (cut.status, cut.complete, cut.body) == (200, False, (b"own:/long" + b"x" * 200_000)[:1000])
        assert (await http.get(f"{base}/globex")).text == "own:/globex"
    assert server.accepted == 2
