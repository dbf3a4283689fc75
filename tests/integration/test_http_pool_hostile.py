"""The pool's own rules under services and callers that press on them: its keep-alive budget,
its shutdown, the sockets of connections it lets go, and answers that come before a request
was read. HTTP tools' way through it (``ServicePool.exchange``) unless a test says otherwise.
Servers are raw asyncio (or, for TLS, threaded) servers on loopback ports."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx

from gateway.tools.http_transport import PARTITION, ServiceCall, ToolConnection, pool_of, service_transport
from tests.integration.test_http_hostile_services import answer, hostile, service_call  # noqa: F401 -- the fixture
from tests.support.tls import client_context, server_context


def call(base: str, path: bytes, partition: object = None, *, method: bytes = b"GET", body: bytes | None = None,
         timeout: float = 5.0) -> ServiceCall:
    return service_call(base + path.decode(), method=method, body=body, partition=partition, timeout=timeout)


def transport_with(*, max_connections: int = 10, max_keepalive: int = 10, keepalive_expiry: float = 5.0,
                   tls: object = None) -> httpx.AsyncHTTPTransport:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive,
                          keepalive_expiry=keepalive_expiry)
    return service_transport(limits=limits, ssl_context=tls)  # type: ignore[arg-type]


async def test_callers_who_never_come_back_do_not_keep_others_from_keep_alive(hostile):
    """One budget of idle connections for the whole pool: a full pool lets its least recently
    used connection go, so a stream of one-off callers cannot make every later call (a model
    provider's included) open a connection of its own."""
    server, base = await hostile(None)
    transport = transport_with(max_keepalive=10, keepalive_expiry=0.1)
    pool = pool_of(transport)
    async with httpx.AsyncClient(transport=transport, timeout=5) as provider:
        for user in range(10):
            await pool.exchange(call(base, b"/tool", ("acme", f"user-{user}")))
        await asyncio.sleep(0.3)  # every one of those idle connections has expired
        before = server.accepted
        for _ in range(3):
            assert (await provider.get(f"{base}/v1/chat")).text == "own:/v1/chat"
        for _ in range(3):
            assert (await pool.exchange(call(base, b"/again", ("acme", "bob")))).body == b"own:/again"
        assert server.accepted - before == 2  # one for the provider, one for bob
        assert len(pool._idle_order) <= 10  # noqa: SLF001 -- the budget is the point here


async def test_a_pool_closed_while_a_call_is_in_flight_keeps_nothing_after(hostile):
    async def slow(number: int, path: bytes, reader, writer) -> bool:
        if path != b"/slow":
            return False
        await asyncio.sleep(0.2)
        writer.write(answer(b"own:/slow"))
        await writer.drain()
        return True

    _, base = await hostile(slow)
    transport = transport_with()
    pool = pool_of(transport)
    in_flight = asyncio.create_task(pool.exchange(call(base, b"/slow")))
    await asyncio.sleep(0.05)
    await transport.aclose()
    assert (await in_flight).body == b"own:/slow"
    assert pool._idle == {}  # noqa: SLF001 -- its connection was closed, not kept


async def test_an_answer_to_an_unread_body_ends_the_connection_even_for_the_same_caller(hostile):
    """A service that refuses a body without reading it may read that body as its next request
    and answer it later, after the next call was sent: only a connection nobody reuses is safe."""

    async def answer_without_reading_the_body(number: int, path: bytes, reader, writer) -> bool:
        if path == b"/upload":
            writer.write(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\n\r\ntoo large")
            await writer.drain()
            return True
        if path == b"/smuggled":
            await asyncio.sleep(0.05)  # answered late: after the caller's next request went out
        return False

    server, base = await hostile(answer_without_reading_the_body)
    smuggled = b"GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
    transport = transport_with()
    pool = pool_of(transport)
    async with transport:
        refused = await pool.exchange(call(base, b"/upload", ("acme", "alice"), method=b"POST", body=smuggled))
        assert (refused.status, refused.body) == (413, b"too large")
        assert (await pool.exchange(call(base, b"/orders", ("acme", "alice")))).body == b"own:/orders"
    assert server.accepted == 2


async def test_an_answer_that_came_while_the_service_stopped_reading_is_still_the_calls(hostile):
    """The service answers 413 after the head and stops reading, the connection left open: the
    call gets the 413, not a write timeout while the rest of its body waits to be sent."""

    async def refuse_and_stop_reading(number: int, path: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\n\r\ntoo large")
        await writer.drain()
        await asyncio.sleep(5)
        return True

    _, base = await hostile(refuse_and_stop_reading)
    transport = transport_with()
    pool = pool_of(transport)
    async with transport:
        refused = await pool.exchange(call(base, b"/upload", method=b"POST", body=b"a" * (32 << 20), timeout=1))
        assert (refused.status, refused.body) == (413, b"too large")
        assert pool._idle == {}  # noqa: SLF001 -- answered early: closed, not kept


async def test_no_partition_a_caller_names_reaches_the_tools_connections(hostile):
    """httpx's requests and HTTP tools' exchanges keep apart, whatever partition a request names."""
    _, base = await hostile(None)
    transport = transport_with()
    pool = pool_of(transport)
    async with httpx.AsyncClient(transport=transport, timeout=5) as http:
        await pool.exchange(call(base, b"/tool", ("acme", "alice")))
        for partition in (("tool", ("acme", "alice")), ("acme", "alice"), None):
            response = await http.get(f"{base}/llm", extensions={PARTITION: partition})
            assert response.text == "own:/llm"


def tls_server_that_ignores_close_notify(stop: threading.Event) -> int:
    """Answers each connection's first request with its answer and a stale one (so the client
    must close the connection), then neither reads nor closes until the test ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    context = server_context()

    def serve() -> None:
        held = []
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            tls = context.wrap_socket(raw, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data:
                data += tls.recv(65536)
            tls.sendall(answer(b"own:/x") + answer(b"stale:/x"))
            held.append(tls)
        for connection in held:
            connection.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


async def test_a_tls_connection_let_go_gives_its_socket_back_at_once():
    """Closing over TLS waits for the peer's close_notify (up to 30 s in asyncio), the socket held
    all the while and outside max_connections: a connection the pool lets go is cut instead."""
    stop = threading.Event()
    port = tls_server_that_ignores_close_notify(stop)
    let_go: list[ToolConnection] = []
    close = ToolConnection.aclose

    async def recording_close(self: ToolConnection) -> None:
        let_go.append(self)
        await close(self)

    transport = transport_with(max_connections=2, max_keepalive=2, tls=client_context())
    pool = pool_of(transport)
    ToolConnection.aclose = recording_close  # type: ignore[method-assign]
    try:
        for _ in range(5):
            assert (await pool.exchange(call(f"https://127.0.0.1:{port}", b"/x"))).body == b"own:/x"
        await asyncio.sleep(0.2)
        sockets = [c._stream._transport.get_extra_info("socket") for c in let_go]  # noqa: SLF001
        assert let_go and not [sock for sock in sockets if sock is not None and sock.fileno() != -1]
    finally:
        ToolConnection.aclose = close  # type: ignore[method-assign]
        await transport.aclose()
        stop.set()


async def test_a_service_that_hangs_holds_at_most_three_quarters_of_the_pool(hostile):
    """A review's reproduction: four tenants' calls (25 turns each) to one hung service held
    the whole pool, and a fifth tenant's call to a healthy service timed out waiting for it."""
    release = asyncio.Event()

    async def hang(number: int, path: bytes, reader, writer) -> bool:
        await release.wait()
        writer.write(answer(b"own:" + path))
        await writer.drain()
        return True

    _, hung = await hostile(hang)
    _, healthy = await hostile(None)
    transport = transport_with(max_connections=8, max_keepalive=8)
    pool = pool_of(transport)
    try:
        stuck = [asyncio.create_task(pool.exchange(call(hung, b"/hang", timeout=5.0))) for _ in range(8)]
        await asyncio.sleep(0.2)
        answered = await pool.exchange(call(healthy, b"/other", timeout=1.0))
        assert answered.body == b"own:/other"
        assert pool.max_per_origin == 6
        release.set()
        assert [(await task).body for task in stuck] == [b"own:/hang"] * 8  # the waiting two in turn
        assert pool._origins == {}  # noqa: SLF001 -- nothing kept for services with no call
    finally:
        release.set()
        await transport.aclose()
