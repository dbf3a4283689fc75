"""The tool-calls route's fast lane: its common request answered without the framework's layers.

``POST /v1/runs/{run_id}/tool-calls`` is the hot route: a model's loop calls it once per
turn. Litestar's routing, connection objects, signature model and response objects cost
the process about as much as the guarded steps themselves. This lane sits inside the
request-context middleware (request id, ``Server-Timing``, in-flight count) and takes a
request only when everything about it is plain:

- ``POST`` to exactly the route's path, an id that is a valid resource id, no query string;
- a bearer token verified recently, of a known caller of a tenant that is fresh in the
  cache and enabled (``cached_caller``, the authentication middleware's own first step).

Anything else goes to the Litestar app untouched, before a byte of the body is read or a
token of the rate limit spent, and is answered there (401, 403, a first token's
verification, 400 for an invalid id, ...). Once taken, the request meets the same steps in
the same order as on the route — the rate limit (``spend_rate``), the body under the same
size limit, ``ToolExecutor.execute_body`` — and an error is answered by the app's own
exception handlers, so the envelope, its status, headers, logging and metrics are the
route's.
"""

from __future__ import annotations

import re
from typing import Any

from litestar import Litestar, Request
from litestar.exceptions import InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.api.context import request_id_of
from gateway.api.errors import CLIENT_DISCONNECTED, ErrorHandler
from gateway.api.params import RESOURCE_ID_PATTERN
from gateway.api.tool_answer import encode_tool_messages
from gateway.auth.middleware import bearer_token, cached_caller
from gateway.logging import bind_request
from gateway.observability.timing import AUTH, STATE_KEY
from gateway.ratelimit.middleware import spend_rate
from gateway.wiring import ServicesSlot

_ROUTE = re.compile(r"/v1/runs/(" + RESOURCE_ID_PATTERN.strip("^$") + r")/tool-calls")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class ToolCallsLane:
    """The lane in front of ``app`` (the Litestar app's handler); ``litestar`` answers errors."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        litestar: Litestar,
        services: ServicesSlot,
        handlers: dict[type[Exception], ErrorHandler],
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self._litestar = litestar
        self._services = services
        self._handlers = handlers
        self._max_body_bytes = max_body_bytes
        self.taken = 0
        """Requests this lane answered (the rest went to the app): for tests and curiosity."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["query_string"]:
            await self.app(scope, receive, send)
            return
        route = _ROUTE.fullmatch(scope["path"])
        declared = _declared_length(scope["headers"]) if route is not None else None
        if route is None or declared == _INVALID:
            await self.app(scope, receive, send)
            return
        timer = scope["state"][STATE_KEY]
        timer.begin()
        token = bearer_token(scope["headers"])
        services = self._services.services
        principal = (
            cached_caller(token, services.token_verifier, services.tenant_directory) if token is not None else None
        )
        if principal is None:
            await self.app(scope, receive, send)
            return
        timer.lap(AUTH)
        self.taken += 1
        scope["user"] = principal
        bind_request(tenant=principal.tenant_id, user=principal.user_id)
        try:
            if services.rate_limiter is not None:
                await spend_rate(services.rate_limiter, principal)
            body = await self._body(receive, declared)
            timer.begin()
            messages = await services.executor.execute_body(
                principal, route.group(1), body, request_id=request_id_of(scope), timer=timer
            )
            answer = encode_tool_messages(messages)
        except Exception as exc:  # noqa: BLE001 - answered as the app answers it, by its own handlers
            await self._answer_error(exc, scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(answer)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    async def _body(self, receive: Receive, declared: int | None) -> bytes:
        """The whole body, refused as the framework refuses it: over the limit (by its declared
        length or as it arrives) with 413, a client gone mid-body with its disconnect."""
        limit = self._max_body_bytes
        if declared is not None and declared > limit:
            raise RequestEntityTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InternalServerException(CLIENT_DISCONNECTED)
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise RequestEntityTooLarge
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _answer_error(self, exc: Exception, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._handler_for(exc)
        request: Request[Any, Any, Any] = self._litestar.request_class(scope=scope, receive=receive, send=send)
        response = handler(request, exc)
        await response.to_asgi_response(app=None, request=request, type_encoders=self._litestar.type_encoders)(
            scope, receive, send
        )

    def _handler_for(self, exc: Exception) -> ErrorHandler:
        for kind in type(exc).__mro__:
            handler = self._handlers.get(kind)
            if handler is not None:
                return handler
        return self._handlers[Exception]



_INVALID = -1


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The ``Content-Length`` as a number; None when absent, ``_INVALID`` when it is not one
    (the app answers that)."""
    for name, value in headers:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                return _INVALID
            return declared if declared >= 0 else _INVALID
    return None
