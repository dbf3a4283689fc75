"""Per-request context: the request id (bound to every log event and echoed in
``X-Request-ID``), the stage timer (answered in ``Server-Timing``) and the count of
requests in flight (awaited at shutdown)."""

from __future__ import annotations

import asyncio
import os
import re
import time

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import new_error_id
from gateway.logging import end_request_context, log_failure, start_request_context
from gateway.observability.metrics import Metrics
from gateway.observability.timing import SERVER_TIMING_HEADER, STATE_KEY, VALIDATION, StageTimer

_ACCEPTED_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
REQUEST_ID_HEADER = b"x-request-id"


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


class InFlight:
    """How many HTTP requests this process is handling; shutdown waits for it to reach zero."""

    def __init__(self) -> None:
        self.count = 0

    async def drained(self, timeout_s: float) -> bool:
        """Wait (bounded) until no request is in flight; False when some still are."""
        deadline = time.monotonic() + timeout_s
        while self.count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.count == 0


_INTERNAL_ERROR_BODY = (
    b'{"error":{"code":"INTERNAL_ERROR","message":"Internal error.","request_id":"%s","error_id":"%s"}}'
)


_UNPRINTABLE_PATH_BODY = (
    b'{"error":{"code":"INVALID_REQUEST","message":"The path holds a control or other unprintable character: '
    b'no path of this API does.","request_id":"%s"}}'
)


async def _send_envelope(send: Send, status: int, body: bytes) -> None:
    """An error envelope answered here, outside the app's exception handlers."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestContextMiddleware:
    """Accepts a well-formed ``X-Request-ID`` or makes one, binds it for logging, times the
    request's stages, answers them in ``Server-Timing`` and adds those of tool-call requests
    to the app's ``metrics``. An API path holding an unprintable character goes no further: 400."""

    def __init__(
        self, app: ASGIApp, *, metrics: Metrics, in_flight: InFlight | None = None, pages_prefix: str | None = None
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.in_flight = in_flight if in_flight is not None else InFlight()
        # Paths under it are a browser's pages, which answer a malformed id with a page of
        # their own (404), not with the API's envelope.
        self.pages_prefix = pages_prefix + "/" if pages_prefix else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timer = StageTimer()
        request_id = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                candidate = value.decode("latin-1")
                if _ACCEPTED_REQUEST_ID.fullmatch(candidate):
                    request_id = candidate
                break
        if request_id is None:
            request_id = "req_" + os.urandom(16).hex()
        state = scope.setdefault("state", {})  # type: ignore[typeddict-item]
        state["request_id"] = request_id
        state[STATE_KEY] = timer
        header_value = request_id.encode()
        metrics = self.metrics
        started = False

        async def send_with_context(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER]
                headers.append((REQUEST_ID_HEADER, header_value))
                if timer.touched:
                    headers.append((SERVER_TIMING_HEADER, timer.header_value()))
                    if timer.spent[VALIDATION]:  # the executor ran: a tool-call request
                        metrics.stages(timer)
                message["headers"] = headers
            await send(message)

        context = start_request_context(request_id=request_id)
        self.in_flight.count += 1
        try:
            # Every path parameter is an id or a name of printable characters, but Python's `$`
            # in their patterns also matches before a final newline ("/v1/runs/run_1%0A"):
            # such a path is refused here, for every route of the API at once.
            path = scope["path"]
            if path.isprintable() or (self.pages_prefix is not None and path.startswith(self.pages_prefix)):
                await self.app(scope, receive, send_with_context)
            else:
                metrics.http_error("INVALID_REQUEST")
                await _send_envelope(send_with_context, 400, _UNPRINTABLE_PATH_BODY % header_value)
        except Exception as exc:  # noqa: BLE001 - what escaped every handler: a stream that broke, say
            await self._failed(exc, request_id, started, scope, send_with_context)
        finally:
            self.in_flight.count -= 1
            end_request_context(context)

    @staticmethod
    async def _failed(exc: Exception, request_id: str, started: bool, scope: Scope, send: Send) -> None:
        """An exception no handler answered: logged with its stack under an error id, within the
        request's context. Before the response started, the client gets the envelope; after, the
        response is cut short (the server closes the connection) and the log says so."""
        error_id = new_error_id()
        log_failure("request_failed", exc, error_id=error_id, path=scope.get("path"), response_started=started)
        if started:
            return
        await _send_envelope(send, 500, _INTERNAL_ERROR_BODY % (request_id.encode(), error_id.encode()))
