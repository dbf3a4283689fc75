"""uvicorn's httptools protocol, answering each response in one write.

uvicorn writes a response's status line and headers when the app sends
``http.response.start``, and its body when the app sends ``http.response.body``: two system
calls and, with ``TCP_NODELAY``, two TCP segments for every small answer. Under load each
costs the serving process about a twentieth of its CPU per request, and the client as much
again. ``CoalescingTransport`` holds what is written during one turn of the event loop and
hands it to the socket's transport in one write when that turn ends, or at once when it
grows past ``FLUSH_AT_BYTES`` (so a large or streamed body still meets the transport's
flow control: the transport pauses the protocol, and uvicorn waits for it to drain).
Closing, ``write_eof``, the peer's end of its side and handing the connection to another
protocol write what is held first; ``abort`` drops it, as the transport drops its own buffer.
What reaches the client is what uvicorn delivers without the wrapper, in fewer writes.

The protocol also bounds a request's head (request line and headers), which uvicorn leaves
unbounded with httptools: the parser's callbacks append each piece of a header to what came
before, so a head streamed without end costs memory and CPU that grow faster than its size,
before any authentication. A head larger than ``GATEWAY_MAX_HEAD_BYTES`` is answered
``431 HEADERS_TOO_LARGE``; one not complete ``GATEWAY_HEAD_TIMEOUT_S`` after its first byte
(or after the connection opened) is answered ``408 INVALID_REQUEST``, and a connection that
never sent a byte in that time is closed. Either way the connection is closed. A head's bytes
are counted as they are fed to the parser, request after request, so pipelined requests are
counted each on its own (a read is fed only up to the end of a body of declared length, the
rest as a head; a head that begins in bytes fed with the request before it is counted by the
parser's callbacks, or as the whole read after a chunked body), and its clock starts at its
first byte all the same. A request answered before its body ended (a 413) leaves its next
head a clock too: the body's last bytes stopped uvicorn's keep-alive timer. A refusal while requests before it are still being answered
(pipelined) waits for their answers: they may have run, and a client must not take the
refusal for theirs. A body must arrive within ``GATEWAY_BODY_TIMEOUT_S`` of its head (of the
moment its request may be read, when it waits behind a pipelined one), also
when the request was answered before it (a 413, a 404: uvicorn reads and drops the rest, as
it should, so that the client reads the answer rather than a reset): a body dripped a byte at
a time held a connection for ever, every byte putting off uvicorn's keep-alive timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import structlog
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.api.stalled_streams import ABORT_EXTENSION
from gateway.errors import ErrorCode

FLUSH_AT_BYTES = 64 * 1024

log = structlog.get_logger("gateway.http")


class HeadLimits:
    """What a request's head and body may take (set from the settings by ``configure``)."""

    max_bytes = 65_536
    timeout_s = 20.0
    body_timeout_s = 60.0


def configure(*, max_head_bytes: int, head_timeout_s: float, body_timeout_s: float) -> None:
    """Apply the settings in this process (each worker builds its app, and calls this, first)."""
    HeadLimits.max_bytes = max_head_bytes
    HeadLimits.timeout_s = head_timeout_s
    HeadLimits.body_timeout_s = body_timeout_s


def _refusal(status: int, code: ErrorCode, message: str) -> bytes:
    body = msgspec.json.encode({"error": {"code": code.value, "message": message, "request_id": None, "error_id": None}})
    return b"".join([
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n\r\n",
        body,
    ])


class CoalescingTransport(asyncio.Transport):
    """A socket transport whose writes of one event loop turn leave together."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    # --- writing --------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._transport.is_closing():
            # Closing (the peer ended its side, say): write as the transport writes then,
            # after what is held, in order.
            self.flush()
            self._write_now(data)
            return
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        # A bytearray or a view may change once write returns: keep a copy, as the transport would.
        self._held.append(data if type(data) is bytes else bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes >= FLUSH_AT_BYTES:
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Hand what is held to the transport (called when the loop turn ends)."""
        if not self._held:
            return
        held = self._held
        self._held = []
        self._held_bytes = 0
        # Even while the transport closes: a client that ended its side of the connection
        # after its request still reads the answer (the transport drops writes once the
        # connection is lost, as it would have dropped them unheld).
        self._write_now(held[0] if len(held) == 1 else b"".join(held))

    def _write_now(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._transport.write(data)
        except RuntimeError:
            # uvloop refuses a write on a handle already closed: the connection is gone, and
            # what was written goes with it (an earlier pipelined request answering after its
            # client hung up, say). Anything else (a write after write_eof) is not ours to hide.
            if not self._transport.is_closing():
                raise

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    # --- ending ---------------------------------------------------------------------------

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def abort(self) -> None:
        self._held = []
        self._held_bytes = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    # --- everything else is the transport's -------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a ``CoalescingTransport``, with its
    requests' heads bounded in size and time."""

    _head_bytes = 0
    """Bytes of the head being read, counted as they are fed to the parser while a head is
    read. A read is fed only up to the end of a body of declared length; a head that begins
    within bytes fed with the request before it (the piece that ended a head and its short
    body, a chunked body's end) is counted by the parser's callbacks, and after a chunked body
    as the whole read: such a head may reach at most about twice the limit."""
    _head_begun = False
    """The parser met the first byte of a request line (reset when the request is complete)."""
    _finished_in_feed = False
    """A request was completed by the bytes being fed: a head that follows in them is counted
    by the parser's callbacks (the bytes counted before were the finished request's)."""
    _reading_head = True
    _head_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_left: int | None = None
    """Of a body with a ``Content-Length``, the bytes still to come (``None``: none declared,
    or chunked): a read is fed to the parser only up to the body's end, the rest as a head."""
    _oversized = False
    """A head past the limit arrived whole within one feed: the request is refused, not run."""
    _deferred: tuple[int, ErrorCode, str] | None = None
    """A refusal waiting for the answers of the requests before it (pipelined): written, and
    the connection closed, once the last of them is complete."""

    def data_received(self, data: bytes) -> None:
        if self._deferred is not None:
            return  # the connection ends once the answers before the refusal are out
        while data:
            if not self._reading_head:
                left = self._body_left
                if left is not None and len(data) > left:
                    # The body ends within this read: the rest is the next request's, fed (and
                    # its head counted) as a head.
                    self._feed(data[:left])
                    data = data[left:]
                    if self.transport.is_closing() or self._deferred is not None:
                        return
                    continue
                self._feed(data)
                if self._reading_head and self._head_begun and left is None:
                    # A chunked body ended within this read, and a head began after it: its
                    # bytes are at most the read's (an open header is not reported yet).
                    self._head_bytes = max(self._head_bytes, len(data))
                if self._oversized or (self._reading_head and self._head_bytes > HeadLimits.max_bytes):
                    self._refuse(431, ErrorCode.HEADERS_TOO_LARGE, "The request line and headers are too large.")
                    return
                break
            room = HeadLimits.max_bytes - self._head_bytes
            if room <= 0:
                self._refuse(431, ErrorCode.HEADERS_TOO_LARGE, "The request line and headers are too large.")
                return
            # The parser reads at most the room left: the head may end within it (a body or the
            # next pipelined request following), and what is left is fed as the state then says.
            if len(data) <= room:
                piece, data = data, b""
            else:
                piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            self._feed(piece)
            if self._oversized:
                self._refuse(431, ErrorCode.HEADERS_TOO_LARGE, "The request line and headers are too large.")
                return
            if self.transport.is_closing() or self._deferred is not None:
                return
        if self.transport.is_closing():
            return
        # A head begun but not complete, or a body still to come, gets its clock now (a request
        # that arrives whole in one read, the common case, sets no timer at all).
        if self._reading_head:
            if (self._head_bytes or self._head_begun) and self._head_timer is None:
                self._arm_head_timer()
        elif self._body_timer is None:
            self._body_timer = self.loop.call_later(HeadLimits.body_timeout_s, self._body_timed_out)

    def _feed(self, data: bytes) -> None:
        self._finished_in_feed = False
        try:
            super().data_received(data)
        finally:
            self._finished_in_feed = False

    def on_message_begin(self) -> None:
        self._head_begun = True
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._finished_in_feed:
            self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._finished_in_feed:
            self._head_bytes += len(name) + len(value) + 4
        if self._reading_head and name.lower() == b"content-length":
            self._body_left = int(value)  # the parser refuses a length that is not digits, or two
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._disarm_head_timer()
        if self._head_bytes > HeadLimits.max_bytes:
            # Whole, yet past the limit (counted by the callbacks): never dispatched, and the
            # rest of what was fed goes nowhere; refused once the feed returns.
            self._oversized = True
            return
        scope_extensions = self.scope.setdefault("extensions", {})  # type: ignore[typeddict-item]
        scope_extensions[ABORT_EXTENSION] = self._abort
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        if not self._oversized:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._oversized:
            return
        super().on_message_complete()
        self._reading_head = True
        self._head_begun = False
        self._finished_in_feed = True
        self._head_bytes = 0
        self._body_left = None
        self._disarm_body_timer()
        if self.cycle is not None and self.cycle.response_complete and self._head_timer is None:
            # Answered before its body ended (a 413, a 404): uvicorn's keep-alive clock ran from
            # the answer, and the body's last bytes stopped it. The next head gets its clock
            # now, and a connection that sends none is closed when it runs out.
            self._arm_head_timer()

    def on_response_complete(self) -> None:
        waiting = bool(self.pipeline)
        super().on_response_complete()
        if waiting and not self._reading_head and self._body_timer is not None:
            # The next request, whose body is still to come, may be read from now: its body
            # gets the whole of its deadline from here.
            self._disarm_body_timer()
            self._body_timer = self.loop.call_later(HeadLimits.body_timeout_s, self._body_timed_out)
        if self._deferred is not None and not self._answering() and not self.transport.is_closing():
            status, code, message = self._deferred
            self._deferred = None
            self._refuse(status, code, message)

    def _answering(self) -> bool:
        """A request before the one being read is still being answered (pipelined)."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_body_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(HeadLimits.timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._reading_head or self.transport.is_closing():
            return
        if self._head_bytes or self._head_begun:
            self._refuse(408, ErrorCode.INVALID_REQUEST, "The request's head was not complete in time.")
        else:
            log.info("request_head_refused", status=408, head_bytes=0, client=self.client and self.client[0])
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self._reading_head or self.transport.is_closing():
            return
        if self.pipeline:
            # The body's request waits behind an earlier one, and uvicorn reads nothing until
            # that is answered: its clock starts again.
            self._body_timer = self.loop.call_later(HeadLimits.body_timeout_s, self._body_timed_out)
            return
        # The app may be reading the body, or answering: the connection goes, and the app's
        # next receive says the client left.
        log.info("request_body_timed_out", timeout_s=HeadLimits.body_timeout_s, client=self.client and self.client[0])
        self._abort()

    def _abort(self) -> None:
        """Close the connection now, dropping what is not sent (a stalled stream's end)."""
        self.transport.abort()

    def _refuse(self, status: int, code: ErrorCode, message: str) -> None:
        self._disarm_head_timer()
        if self._answering():
            # Answered only after the requests before it, which may have run already: their
            # answers are not cut off, and this one is not taken for theirs.
            if self._deferred is None:
                self._deferred = (status, code, message)
                self.transport.pause_reading()
            return
        log.info("request_head_refused", status=status, head_bytes=self._head_bytes, client=self.client and self.client[0])
        self.transport.write(_refusal(status, code, message))
        self.transport.close()

    def eof_received(self) -> None:
        # The transport closes itself once this returns (uvicorn keeps no half-open
        # connections): an answer already written goes out first, as it would unheld. An answer
        # still being made when the client ends its side is lost, with or without this wrapper.
        self.transport.flush()  # type: ignore[attr-defined]
        super().eof_received()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._arm_head_timer()  # a connection that sends nothing is closed too
