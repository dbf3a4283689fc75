"""The HTTP transport of the gateway's pooled client (HTTP tools, model providers, JWKS).

httpx's default transport spends most of an HTTP tool call's CPU in its connection pool
under concurrency (measured: 3.6 ms a request at 32 concurrent calls, against ~0.3 ms
here): httpcore 1.0.x's ``AsyncConnectionPool`` re-examines every connection of the pool
(and counts them once per connection: quadratic) each time a request starts or ends.
``ServicePool`` keeps idle connections per origin and partition and takes or returns one
in constant time.

A pooled connection is reused only when its last exchange is complete and nothing is left
over: h11 keeps bytes that followed a response in its buffer and httpcore reuses the
connection anyway (extra bytes in the response's packet, or a body longer than its
Content-Length, become the next request's response), and bytes a service writes after its
response land in the connection's buffer while it is idle. ``AsyncioStream`` owns that
buffer, so ``ServiceConnection.reusable`` can look at h11's, the stream's and the kernel's.
No check can tell bytes that arrive after the next request was sent from its response, so
calls of different partitions (HTTP tools: tenant and user) never share a connection.

Bodies are read raw and capped by ``read_capped``: every request asks for identity, and
a body that comes compressed anyway is refused, never inflated (a few KB of gzip can
expand to gigabytes inside one decoder call).

HTTP/1.1 itself is httpcore's (h11); business services are reached over HTTP/1.1 only.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any, Protocol, cast

import httpcore
import httpx


READ_BUFFER_LIMIT = 256 * 1024
"""Bytes a connection holds unread before it stops reading from its socket."""


class AsyncioStream(asyncio.Protocol, httpcore.AsyncNetworkStream):
    """One connection to a service, its received bytes in a buffer of its own.

    Owning the buffer lets the pool ask the one question that decides reuse: did anything
    arrive that no response has claimed? Bytes already received are handed out before a
    reset is reported, so a response that arrived whole still reaches its call.
    """

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.answered_early = False
        """Bytes had arrived when part of a request was still to be written: the server may
        not have read all of it, so what it reads next on this connection is unknown."""

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport instances, only alike.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > READ_BUFFER_LIMIT and not self._reading_paused and self._transport is not None:
            self._transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # HTTP/1.1 has no use for a half-closed connection: close it

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._writing_paused = False
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._waiter
        finally:
            self._waiter = None

    # httpcore's side

    def unclaimed(self) -> bool:
        """Whether anything arrived, or the connection ended, outside of any response."""
        if self._buffer or self._eof or self._transport is None or self._transport.is_closing():
            return True
        sock = self._transport.get_extra_info("socket")
        if sock is None:
            return False
        # Bytes the kernel holds that the event loop has not delivered yet (poll, not select:
        # a busy process has descriptors past select's limit).
        poll = select.poll()
        poll.register(sock.fileno(), select.POLLIN)
        return bool(poll.poll(0))

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        while not self._buffer and not self._eof:
            try:
                await self._wait(timeout)
            except TimeoutError:
                raise httpcore.ReadTimeout() from None
        if self._buffer:
            data = bytes(self._buffer[:max_bytes])
            del self._buffer[:max_bytes]
            if self._reading_paused and len(self._buffer) <= READ_BUFFER_LIMIT // 4 and self._transport is not None:
                self._reading_paused = False
                self._transport.resume_reading()
            return data
        if self._error is not None:
            raise httpcore.ReadError(type(self._error).__name__)
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._buffer or self._eof:
            self.answered_early = True
        transport = self._transport
        if transport is None or transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        transport.write(buffer)
        while self._writing_paused:
            try:
                await self._wait(timeout)
            except TimeoutError:
                raise httpcore.WriteTimeout() from None
            if self._buffer:
                self.answered_early = True  # while these bytes waited to be sent
        if self._error is not None:
            raise httpcore.WriteError(type(self._error).__name__)

    async def aclose(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size():
            transport.abort()  # a peer that stopped reading must not hold the socket open
        else:
            transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        assert self._transport is not None
        try:
            async with asyncio.timeout(timeout):
                transport = await asyncio.get_running_loop().start_tls(
                    self._transport, self, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            await self.aclose()
            raise httpcore.ConnectTimeout() from None
        except (OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(type(exc).__name__) from None
        self._transport = cast(asyncio.Transport, transport)
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return self.unclaimed()
        if self._transport is None:
            return None
        if info in ("ssl_object", "socket"):
            return self._transport.get_extra_info(info)
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                transport, stream = await asyncio.get_running_loop().create_connection(
                    AsyncioStream, host, port, local_addr=(local_address, 0) if local_address else None
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout() from None
        except OSError as exc:
            raise httpcore.ConnectError(type(exc).__name__) from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for option in socket_options or ():
                sock.setsockopt(*option)
        return stream

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("business services are reached over TCP")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


PARTITION = "gateway.connection_partition"
"""Request extension naming whose calls may share a connection (HTTP tools: the caller's
tenant and user). Calls of different partitions never share one."""


class ServiceConnection(httpcore.AsyncHTTP11Connection):
    """httpcore's HTTP/1.1 connection, and the check that decides whether it may be reused."""

    def __init__(self, *, origin: httpcore.Origin, stream: AsyncioStream, keepalive_expiry: float | None) -> None:
        super().__init__(origin=origin, stream=stream, keepalive_expiry=keepalive_expiry)
        self._stream = stream
        # httpcore's lock is anyio's, which yields to the event loop on every acquisition, even
        # uncontended: two extra loop turns per request. The pool gives a connection to one
        # request at a time, so asyncio's lock (no turn when free) keeps the same guarantee.
        self._state_lock = asyncio.Lock()  # type: ignore[assignment]

    def reusable(self) -> bool:
        """The last exchange is complete (request sent before any answer arrived, response read
        to its end) and no byte is left over: not in h11's buffer, not in the stream's, not in
        the kernel's. Anything else could become the next call's response."""
        if not self.is_idle() or self._stream.answered_early:
            return False
        leftover, closed = self._h11_state.trailing_data
        return not leftover and not closed and not self._stream.unclaimed()


class ServicePool:
    """Keep-alive HTTP/1.1 connections per origin and partition, reused most-recent first.

    A request takes an idle connection of its origin and partition (skipping any that is not
    clean or whose keep-alive expired) or opens one, under ``max_connections`` for the whole
    pool; when its response is closed, a clean connection goes back to its idle list (at most
    ``max_keepalive_connections`` idle in all), any other is closed. Every step is constant
    time, whatever the number of connections.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext,
        max_connections: int,
        max_keepalive_connections: int,
        keepalive_expiry: float | None,
        network_backend: httpcore.AsyncNetworkBackend,
    ) -> None:
        self._ssl_context = ssl_context
        self.max_connections = max_connections
        self.max_keepalive_connections = max_keepalive_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._keepalive_expiry = keepalive_expiry
        self._backend = network_backend
        self._idle: dict[_Key, list[ServiceConnection]] = {}
        self._idle_count = 0

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        timeouts = request.extensions.get("timeout", {})
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError:
            raise httpcore.PoolTimeout() from None
        key = _key(request)
        connection: ServiceConnection | None = None
        try:
            connection = await self._take_idle(key) or await self._connect(request, timeouts)
            response = await connection.handle_async_request(request)
        except BaseException:
            self._slots.release()
            if connection is not None:
                await connection.aclose()
            raise
        # The response as httpcore made it (building another one re-checks its headers), its
        # body handing the connection back when closed.
        response.stream = _ReleasingStream(response.stream, self, connection, key)
        return response

    async def _take_idle(self, key: _Key) -> ServiceConnection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if not idle:
                # Partitions are callers: an entry left for each one ever served would grow
                # without bound.
                del self._idle[key]
            if connection.reusable() and not connection.has_expired():
                return connection
            await connection.aclose()
        return None

    async def _connect(self, request: httpcore.Request, timeouts: dict[str, Any]) -> ServiceConnection:
        origin = request.url.origin
        stream = await self._backend.connect_tcp(
            origin.host.decode("ascii"), origin.port, timeout=timeouts.get("connect")
        )
        if origin.scheme == b"https":
            stream = await stream.start_tls(
                self._ssl_context, server_hostname=origin.host.decode("ascii"), timeout=timeouts.get("connect")
            )
        assert isinstance(stream, AsyncioStream)
        return ServiceConnection(origin=origin, stream=stream, keepalive_expiry=self._keepalive_expiry)

    async def release(self, connection: ServiceConnection, key: _Key) -> None:
        self._slots.release()
        if connection.reusable() and self._idle_count < self.max_keepalive_connections:
            self._idle.setdefault(key, []).append(connection)
            self._idle_count += 1
        else:
            await connection.aclose()

    async def aclose(self) -> None:
        idle, self._idle, self._idle_count = self._idle, {}, 0
        for connections in idle.values():
            for connection in connections:
                await connection.aclose()

    async def __aenter__(self) -> ServicePool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_Key = tuple[bytes, bytes, int, Any]


def _key(request: httpcore.Request) -> _Key:
    origin = request.url.origin
    return (origin.scheme, origin.host, origin.port, request.extensions.get(PARTITION))


class _ReleasingStream:
    """A response body that hands its connection back to the pool once it is closed."""

    def __init__(self, stream: Any, pool: ServicePool, connection: ServiceConnection, key: _Key) -> None:
        self._stream = stream
        self._pool = pool
        self._connection = connection
        self._key = key
        self._released = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return cast(AsyncIterator[bytes], self._stream.__aiter__())

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()
        finally:
            await self._pool.release(self._connection, self._key)


def service_transport(*, limits: httpx.Limits, ssl_context: ssl.SSLContext | None = None) -> httpx.AsyncHTTPTransport:
    """httpx's transport with the constant-time pool and the asyncio backend in place of
    httpcore's defaults; requests and responses are still httpx's. ``ssl_context`` defaults
    to httpx's (the system's certificate authorities)."""
    transport = httpx.AsyncHTTPTransport(limits=limits, retries=0)
    transport._pool = ServicePool(  # type: ignore[assignment]  # noqa: SLF001 -- the one place httpx builds its pool
        ssl_context=ssl_context or httpx.create_ssl_context(),
        max_connections=limits.max_connections or 100,
        max_keepalive_connections=limits.max_keepalive_connections or 0,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=AsyncioBackend(),
    )
    return transport


class RequestSender(Protocol):
    """What sends an httpcore request: ``ServicePool``, or httpcore's own pool."""

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response: ...


def pool_of(transport: httpx.AsyncHTTPTransport) -> RequestSender:
    """The connection pool under an httpx transport (``ServicePool`` for ``service_transport``):
    what HTTP tools send through, without httpx's request and response objects around it."""
    return cast(RequestSender, transport._pool)  # noqa: SLF001 -- see service_transport


IDENTITY = {"accept-encoding": "identity"}
"""Headers that ask for an uncompressed body; ``read_capped`` refuses any other."""


class EncodedBody(Exception):
    """The response came compressed (or otherwise encoded) although identity was asked for."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding[:40]
        super().__init__(self.encoding)


async def read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body as sent, up to ``limit`` bytes, and whether that was all of it.

    Raises ``EncodedBody`` for a ``Content-Encoding`` other than identity, before reading.
    Reading stops at the first chunk past the limit (a chunk is at most one socket read);
    a stream left unread is closed, not drained, and its connection is not reused."""
    return await _read_capped(response.headers.get("content-encoding", ""), response.aiter_raw(), limit)


async def read_capped_response(response: httpcore.Response, limit: int) -> tuple[bytes, bool]:
    """``read_capped`` for a response of the connection pool itself (``pool_of``)."""
    return await _read_capped(
        header_value(response.headers, b"content-encoding").decode("latin-1"), response.aiter_stream(), limit
    )


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    """Header ``name`` (lower case) of a raw header list, b"" when absent; repeated, its values
    joined with ", " as httpx does (a second Content-Encoding must not hide behind a first)."""
    values = [value for key, value in headers if key.lower() == name]
    return values[0] if len(values) == 1 else b", ".join(values)


async def _read_capped(content_encoding: str, chunks: AsyncIterator[bytes], limit: int) -> tuple[bytes, bool]:
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity"):
        raise EncodedBody(encoding)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts)[:limit], False
    return b"".join(parts), True
