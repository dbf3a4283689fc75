"""A streamed response that ends when its client stops taking it.

Before it accepts the next chunk of a body, uvicorn waits for a socket whose buffers are
full to drain (flow control), and it waits without end: a client that connects and never
reads would keep whatever the stream holds (an audit export's slot, its tenant's and the
process's) until the connection drops. ``StallLimitedStream`` sends the body in pieces of
``PIECE_BYTES`` and gives each a deadline. A piece the server could not hand to the socket
within it ends the response: the stream's iterator is closed, which gives back what it
holds, and the server closes the connection without the body's last chunk, so the client
sees a transfer cut short, never a complete-looking one. The deadline is per piece, not per
body: a client that keeps taking the body is never cut, however long the whole takes. (A
piece waits for room in the transport's buffer, 64 KiB, which waits for the kernel's; Linux
wakes a writer once about a third of a socket's send buffer is free, so "keeps taking" means
on the order of a megabyte per deadline.)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from litestar.response import Stream
from litestar.types import Message, Receive, Scope, Send

log = structlog.get_logger("gateway.api")


PIECE_BYTES = 16 * 1024
"""The most one send hands over, so that what a client must take within a deadline is the
buffers' room and not also a whole chunk (an export's page of 1,000 rows, ~0.5 MB)."""


ABORT_EXTENSION = "gateway.abort"
"""A request's scope ``extensions`` entry under this name, when the server offers one
(``gateway serve``'s protocol, ``gateway.http_server``), closes the connection at once: a
stalled stream ends so, and uvicorn, seeing the client gone, logs no error. Elsewhere the
server closes the connection itself once the app returns without finishing the body."""


class ClientStalled(Exception):
    """The client took no chunk within the stall deadline."""


class StallLimitedStream(Stream):
    def __init__(
        self, content: AsyncIterator[bytes], *, stall_timeout_s: float, log_fields: dict[str, Any], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._stall_timeout_s = stall_timeout_s
        self._log_fields = log_fields

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        return _StallLimitedResponse(
            super().to_asgi_response(*args, **kwargs), self.iterator, self._stall_timeout_s, self._log_fields
        )


class _StallLimitedResponse:
    __slots__ = ("_iterator", "_log_fields", "_response", "_stall_timeout_s")

    def __init__(self, response: Any, iterator: Any, stall_timeout_s: float, log_fields: dict[str, Any]) -> None:
        self._response = response
        self._iterator = iterator
        self._stall_timeout_s = stall_timeout_s
        self._log_fields = log_fields

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent_bytes = 0
        started = time.monotonic()

        async def send_piece(message: Message) -> None:
            nonlocal sent_bytes
            with anyio.move_on_after(self._stall_timeout_s) as deadline:
                await send(message)
            # Only this deadline: a cancellation from outside (the client went away) propagates.
            if deadline.cancelled_caught:
                raise ClientStalled
            sent_bytes += len(message.get("body", b""))

        async def send_in_time(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= PIECE_BYTES:
                await send_piece(message)
                return
            starts = range(0, len(body), PIECE_BYTES)
            for start in starts[:-1]:
                piece = {"type": "http.response.body", "body": body[start : start + PIECE_BYTES], "more_body": True}
                await send_piece(piece)  # type: ignore[arg-type]
            await send_piece({**message, "body": body[starts[-1] :]})  # type: ignore[typeddict-item]

        try:
            await self._response(scope, receive, send_in_time)
        except* ClientStalled:
            log.warning(
                "stream_client_stalled",
                stall_timeout_s=self._stall_timeout_s,
                sent_bytes=sent_bytes,
                streamed_s=round(time.monotonic() - started, 3),
                **self._log_fields,
            )
            abort = (scope.get("extensions") or {}).get(ABORT_EXTENSION)
            if abort is not None:
                abort()
            aclose = getattr(self._iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            # The transport reports the connection lost on the loop's next turn: let it, so the
            # server knows the client is gone before this returns.
            await anyio.sleep(0)
