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

Two ways through the pool, over the same connections' code and limits:
- ``handle_async_request``: httpx's requests (model providers, the JWKS fetch) on httpcore's
  HTTP/1.1 connection, which speaks h11;
- ``exchange``: an HTTP tool's one request and its answer, read up to a limit, on a
  ``ToolConnection`` that speaks HTTP/1.1 through ``http1`` (llhttp, strict). The call needs
  none of what httpcore adds around h11 (request and response objects that check their
  headers again, traces, a streaming body, locks), nor h11's pure-Python parsing: on the HTTP
  tool path those were a third of the gateway's CPU per call.

Business services are reached over HTTP/1.1 only.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpcore
import httpx

from gateway.tools import http1


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
        # Once an answer came, waiting for a peer that stopped reading would only lose it: the
        # transport sends what is buffered on its own, and the connection is never reused.
        while self._writing_paused and not self.answered_early:
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
        if transport.get_write_buffer_size() or transport.get_extra_info("ssl_object") is not None:
            # A peer that stopped reading must not hold the socket open; nor, over TLS, one that
            # never answers close_notify (asyncio waits up to 30 s for it, the socket held all
            # the while, outside max_connections). HTTP/1.1 frames its messages itself: no
            # truncation to guard against.
            transport.abort()
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


@dataclass(slots=True)
class _OriginSlots:
    semaphore: asyncio.Semaphore
    users: int = 0
    """Exchanges holding or waiting for one of the semaphore's slots."""


def connections_per_origin(max_connections: int) -> int:
    """The exchanges one service may have in flight at once: three quarters of the pool."""
    return max(1, max_connections * 3 // 4)


class ServicePool:
    """Keep-alive HTTP/1.1 connections per origin and partition, reused most-recent first.

    A request takes an idle connection of its origin and partition (skipping any that is not
    clean or whose keep-alive expired) or opens one, under ``max_connections`` for the whole
    pool; when its response is closed, a clean connection goes back to its idle list, any other
    is closed. At most ``max_keepalive_connections`` are idle in all: past that the least
    recently released goes. Every step is constant time, whatever the number of connections
    (an eviction removes from one partition's short list).

    An HTTP tool's exchange also takes one of ``max_per_origin`` slots of its service (three
    quarters of the pool): a service that hangs, with several tenants' calls waiting on it,
    leaves the other services a quarter of the pool. (Each tenant has its own turns besides.)
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
        self.max_per_origin = connections_per_origin(max_connections)
        self._origins: dict[tuple[bytes, bytes, int], _OriginSlots] = {}
        """The slots of each service with exchanges in flight or waiting (gone when none is)."""
        self._keepalive_expiry = keepalive_expiry
        self._backend = network_backend
        self._idle: dict[_Key, list[Any]] = {}
        """Idle connections by origin and partition: ``ServiceConnection`` under keys of httpx's
        requests, ``ToolConnection`` under keys of ``exchange`` (their last member says which)."""
        self._idle_order: OrderedDict[Any, _Key] = OrderedDict()
        """Every idle connection, least recently released first: the one a full pool lets go."""
        self._closed = False

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        timeouts = request.extensions.get("timeout", {})
        await self._take_slot(timeouts.get("pool"))
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

    async def exchange(self, call: ServiceCall) -> ServiceAnswer:
        """Send ``call`` and read its answer: the body up to ``call.limit`` bytes for a 2xx,
        ``call.error_limit`` for any other status. Raises httpcore's exceptions (timeouts,
        network and protocol errors) and ``EncodedBody``, as ``handle_async_request`` does."""
        origin = (call.scheme, call.host, call.port)
        slots = await self._take_origin_slot(origin, call.timeouts.get("pool"))
        try:
            await self._take_slot(call.timeouts.get("pool"))
            key = (call.scheme, call.host, call.port, (_TOOL, call.partition))
            connection: ToolConnection | None = None
            try:
                connection = await self._take_idle(key) or await self._connect_tool(call)
                answer = await connection.exchange(call)
            except BaseException:
                self._slots.release()
                if connection is not None:
                    await connection.aclose()
                raise
            await self.release(connection, key)
            return answer
        finally:
            slots.semaphore.release()
            self._leave_origin(origin, slots)

    async def _take_origin_slot(self, origin: tuple[bytes, bytes, int], timeout: float | None) -> _OriginSlots:
        slots = self._origins.get(origin)
        if slots is None:
            slots = self._origins[origin] = _OriginSlots(asyncio.Semaphore(self.max_per_origin))
        slots.users += 1
        try:
            if slots.semaphore.locked():
                async with asyncio.timeout(timeout):
                    await slots.semaphore.acquire()
            else:
                await slots.semaphore.acquire()
        except TimeoutError:
            self._leave_origin(origin, slots)
            raise httpcore.PoolTimeout() from None
        except BaseException:
            self._leave_origin(origin, slots)
            raise
        return slots

    def _leave_origin(self, origin: tuple[bytes, bytes, int], slots: _OriginSlots) -> None:
        slots.users -= 1
        if slots.users == 0 and self._origins.get(origin) is slots:
            del self._origins[origin]

    async def _take_slot(self, timeout: float | None) -> None:
        """One of ``max_connections``, within ``timeout`` (``PoolTimeout`` past it)."""
        if not self._slots.locked():
            # Free, and nobody waiting ahead: taken without suspending, so without a timer.
            await self._slots.acquire()
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpcore.PoolTimeout() from None

    async def _connect_tool(self, call: ServiceCall) -> ToolConnection:
        host = call.host.decode("ascii")
        stream = await self._backend.connect_tcp(host, call.port, timeout=call.timeouts.get("connect"))
        if call.scheme == b"https":
            stream = await stream.start_tls(self._ssl_context, server_hostname=host, timeout=call.timeouts.get("connect"))
        assert isinstance(stream, AsyncioStream)
        return ToolConnection(stream, keepalive_expiry=self._keepalive_expiry)

    async def _take_idle(self, key: _Key) -> Any:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            del self._idle_order[connection]
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

    async def release(self, connection: ServiceConnection | ToolConnection, key: _Key) -> None:
        """Give back ``connection``'s slot and keep it idle if it is clean. At most
        ``max_keepalive_connections`` are kept, across origins and partitions: past that the least
        recently used goes, so callers who never come back cannot keep the others' out."""
        self._slots.release()
        if self._closed or self.max_keepalive_connections <= 0 or not connection.reusable():
            await connection.aclose()
            return
        self._idle.setdefault(key, []).append(connection)
        self._idle_order[connection] = key
        while len(self._idle_order) > self.max_keepalive_connections:
            oldest, oldest_key = self._idle_order.popitem(last=False)
            kept = self._idle[oldest_key]
            kept.remove(oldest)
            if not kept:
                del self._idle[oldest_key]
            await oldest.aclose()

    async def aclose(self) -> None:
        """Close every idle connection; a call still in flight closes its own when it ends."""
        self._closed = True
        idle, self._idle, self._idle_order = self._idle, {}, OrderedDict()
        for connections in idle.values():
            for connection in connections:
                await connection.aclose()

    async def __aenter__(self) -> ServicePool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_Key = tuple[bytes, bytes, int, Any]
_TOOL = object()
"""Marks the partition of ``exchange``'s keys (no partition a caller gives can equal it): its
connections are never handed to httpcore."""


@dataclass(frozen=True, slots=True)
class ServiceCall:
    """One request of an HTTP tool, as ``ServicePool.exchange`` sends it. ``headers`` are all
    of them, ``Host`` and ``Content-Length`` included; ``target`` is the path and query."""

    scheme: bytes
    host: bytes
    port: int
    target: bytes
    method: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    partition: Any
    """Whose calls may share a connection (HTTP tools: the caller's tenant and user)."""
    timeouts: dict[str, float | None]
    """``connect``, ``read``, ``write``, ``pool`` (seconds), as ``httpx.Timeout.as_dict()`` gives them."""
    limit: int
    error_limit: int


@dataclass(frozen=True, slots=True)
class ServiceAnswer:
    status: int
    headers: list[tuple[bytes, bytes]]
    """Names in lower case."""
    body: bytes
    complete: bool
    """False when the body went past its limit: ``body`` is its first ``limit`` bytes."""


READ_NUM_BYTES = 64 * 1024


class ToolConnection:
    """A kept-alive HTTP/1.1 connection of HTTP tool calls, one exchange at a time (the pool
    hands it to one call), spoken by ``http1``. Reused only on the terms of
    ``ServiceConnection``: the last exchange complete on both sides, nothing left over anywhere."""

    def __init__(self, stream: AsyncioStream, *, keepalive_expiry: float | None) -> None:
        self._stream = stream
        self._keepalive_expiry = keepalive_expiry
        self._idle_since = time.monotonic()
        self._clean = True
        """False once an exchange did not end complete and kept-alive, or an answer may have
        come before its request's body was read."""

    async def exchange(self, call: ServiceCall) -> ServiceAnswer:
        data = http1.encode_request(call.method, call.target, call.headers, call.body)
        self._clean = False  # until this exchange ends as the next one may follow it
        try:
            await self._stream.write(data, timeout=call.timeouts.get("write"))
        except httpcore.WriteError:
            # A service may answer and close before it read the whole request (a 413, say): its
            # answer is still this call's. The connection is not reused (answered_early, or it ended).
            pass
        read_timeout = call.timeouts.get("read")
        answer = http1.ResponseReader()
        while answer.status is None:
            await self._receive(answer, read_timeout)
        status = answer.status
        refuse_encoded(header_value(answer.headers, b"content-encoding").decode("latin-1"), status, answer.headers)
        limit = call.limit if 200 <= status < 300 else call.error_limit
        while not answer.complete and len(answer.body) <= limit:
            await self._receive(answer, read_timeout)
        if len(answer.body) > limit:
            # Cut at its limit (one copy, not two: a result may be megabytes): the rest is never
            # read, and the connection is closed when released.
            with memoryview(answer.body) as read:
                kept = bytes(read[:limit])
            return ServiceAnswer(status=status, headers=answer.headers, body=kept, complete=False)
        body = bytes(answer.body)
        # How a service refuses a body it did not read (401, 413, ...): it may read that body
        # as its next request, and answer it whenever, so the connection is not reused.
        if answer.keep_alive() and not (call.body and not 200 <= status < 300):
            self._clean = True
            self._idle_since = time.monotonic()
        return ServiceAnswer(status=status, headers=answer.headers, body=body, complete=True)

    async def _receive(self, answer: http1.ResponseReader, timeout: float | None) -> None:
        data = await self._stream.read(READ_NUM_BYTES, timeout=timeout)
        if data:
            answer.feed(data)
        else:
            answer.end_of_stream()

    def reusable(self) -> bool:
        """The last exchange ended complete and kept-alive, the request went out before any
        answer arrived, and no byte is left over anywhere."""
        return self._clean and not self._stream.answered_early and not self._stream.unclaimed()

    def has_expired(self) -> bool:
        return self._keepalive_expiry is not None and time.monotonic() - self._idle_since > self._keepalive_expiry

    async def aclose(self) -> None:
        await self._stream.aclose()


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


def pool_of(transport: httpx.AsyncHTTPTransport) -> ServicePool:
    """The connection pool under a ``service_transport``: what HTTP tools exchange through,
    without httpx's request and response objects around it."""
    pool = transport._pool  # noqa: SLF001 -- see service_transport
    if not isinstance(pool, ServicePool):
        raise TypeError("HTTP tools need the transport service_transport makes")
    return pool


IDENTITY = {"accept-encoding": "identity"}
"""Headers that ask for an uncompressed body; ``read_capped`` refuses any other."""


class EncodedBody(Exception):
    """The response came compressed (or otherwise encoded) although identity was asked for."""

    def __init__(
        self, encoding: str, status: int | None = None, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.encoding = encoding[:40]
        self.status = status
        self.headers = headers or []
        """The answer's headers (a refusal's ``Retry-After``), when the pool read them."""
        super().__init__(self.encoding)


async def read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body as sent, up to ``limit`` bytes, and whether that was all of it.

    Raises ``EncodedBody`` for a ``Content-Encoding`` other than identity, before reading.
    Reading stops at the first chunk past the limit (a chunk is at most one socket read);
    a stream left unread is closed, not drained, and its connection is not reused."""
    return await _read_capped(response.headers.get("content-encoding", ""), response.aiter_raw(), limit)


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    """Header ``name`` (lower case) of a raw header list, b"" when absent; repeated, its values
    joined with ", " as httpx does (a second Content-Encoding must not hide behind a first)."""
    values = [value for key, value in headers if key.lower() == name]
    return values[0] if len(values) == 1 else b", ".join(values)


def refuse_encoded(
    content_encoding: str, status: int | None = None, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Raise ``EncodedBody`` unless ``content_encoding`` (a response's header) says identity."""
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity"):
        raise EncodedBody(encoding, status, headers)


async def _read_capped(content_encoding: str, chunks: AsyncIterator[bytes], limit: int) -> tuple[bytes, bool]:
    refuse_encoded(content_encoding)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts)[:limit], False
    return b"".join(parts), True
