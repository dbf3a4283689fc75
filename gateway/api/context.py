"""Per-request context: the request id, bound to every log event and echoed in ``X-Request-ID``."""

from __future__ import annotations

import os
import re

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.logging import end_request_context, start_request_context

_ACCEPTED_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
REQUEST_ID_HEADER = b"x-request-id"


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


class RequestContextMiddleware:
    """Accepts a well-formed ``X-Request-ID`` or makes one, and binds it for logging."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                candidate = value.decode("latin-1")
                if _ACCEPTED_REQUEST_ID.match(candidate):
                    request_id = candidate
                break
        if request_id is None:
            request_id = "req_" + os.urandom(16).hex()
        scope.setdefault("state", {})["request_id"] = request_id  # type: ignore[typeddict-unknown-key]
        header_value = request_id.encode()

        async def send_with_request_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER]
                headers.append((REQUEST_ID_HEADER, header_value))
                message["headers"] = headers
            await send(message)

        context = start_request_context(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_request_id)
        finally:
            end_request_context(context)
