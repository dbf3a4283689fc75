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
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FLUSH_AT_BYTES = 64 * 1024


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
            self._transport.write(data)
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
        try:
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))
        except RuntimeError:
            # uvloop refuses a write on a handle already closed: the connection is gone, and
            # what was held goes with it, as it would have had it been written at once.
            # Anything else (a write after write_eof, say) is not ours to hide.
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
    """uvicorn's httptools protocol writing through a ``CoalescingTransport``."""

    def eof_received(self) -> None:
        # The transport closes itself once this returns (uvicorn keeps no half-open
        # connections): an answer already written goes out first, as it would unheld. An answer
        # still being made when the client ends its side is lost, with or without this wrapper.
        self.transport.flush()  # type: ignore[attr-defined]
        super().eof_received()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
