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
from litestar._asgi.utils import is_valid_host
from litestar.handlers import HTTPRouteHandler
from litestar.middleware._internal.exceptions import ExceptionHandlerMiddleware
from litestar.routes import HTTPRoute
from litestar.exceptions import InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.api.context import request_id_of
from gateway.api.decoding import check_request
from gateway.api.errors import CLIENT_DISCONNECTED, ErrorHandler
from gateway.api.openapi import TOOL_CALLS_PATH
from gateway.api.params import RESOURCE_ID_PATTERN
from gateway.api.runs import RunController
from gateway.api.tool_answer import encode_tool_messages
from gateway.auth.middleware import JWTAuthenticationMiddleware, bearer_token, cached_caller
from gateway.logging import bind_request
from gateway.observability.timing import AUTH, STATE_KEY
from gateway.ratelimit.middleware import RateLimitMiddleware, spend_rate
from gateway.wiring import ServicesSlot

_ROUTE = re.compile(re.escape(TOOL_CALLS_PATH).replace(re.escape("{run_id}"), "(" + RESOURCE_ID_PATTERN.strip("^$") + ")"))
_JSON_HEADERS = [(b"content-type", b"application/json")]


class LaneMismatch(RuntimeError):
    """The route has something the lane would skip: the app refuses to start."""


class ToolCallsLane:
    """The lane in front of ``app`` (the Litestar app's handler); ``litestar`` answers errors.
    Made by ``in_front_of``, which checks that the route has nothing the lane would skip."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        litestar: Litestar,
        services: ServicesSlot,
        handlers: dict[Any, ErrorHandler],
        max_body_bytes: int,
        type_encoders: Any = None,
    ) -> None:
        self.app = app
        self._litestar = litestar
        self._services = services
        self._handlers = handlers
        self._max_body_bytes = max_body_bytes
        self._type_encoders = type_encoders if type_encoders is not None else litestar.type_encoders
        self.taken = 0
        """Requests this lane answered (the rest went to the app): for tests and curiosity."""

    @classmethod
    def in_front_of(cls, litestar: Litestar, *, services: ServicesSlot, rate_limited: bool) -> ToolCallsLane:
        """The lane for ``litestar``'s tool-calls route, with the route's own body limit and
        exception handlers; ``LaneMismatch`` when the route, or the app around it, has a step
        the lane does not take."""
        handler = route_handler(litestar)
        found = {what: items for what, items in _skipped_steps(litestar, handler, rate_limited).items() if items}
        if found:
            raise LaneMismatch(f"the tool-calls route has what its fast lane would skip: {found}")
        max_body = handler.resolve_request_max_body_size()
        if max_body is None:
            raise LaneMismatch("the tool-calls route has no body limit")
        return cls(
            litestar.asgi_handler,
            litestar=litestar,
            services=services,
            handlers=dict(handler.resolve_exception_handlers()),
            max_body_bytes=max_body,
            type_encoders=handler.resolve_type_encoders(),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["query_string"]
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        route = _ROUTE.fullmatch(scope["path"])
        declared = _plain_headers(scope["headers"]) if route is not None else _NOT_PLAIN
        services = self._services.installed
        if declared is _NOT_PLAIN or services is None:
            await self.app(scope, receive, send)
            return
        timer = scope["state"][STATE_KEY]
        timer.begin()
        token = bearer_token(scope["headers"])
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

    async def _body(self, receive: Receive, declared: Any) -> bytes:
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
            if message["type"] != "http.request":
                continue  # as the framework's reader: only body messages count
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
        await response.to_asgi_response(app=None, request=request, type_encoders=self._type_encoders)(
            scope, receive, send
        )

    def _handler_for(self, exc: Exception) -> ErrorHandler:
        for kind in type(exc).__mro__:
            handler = self._handlers.get(kind)
            if handler is not None:
                return handler
        return self._handlers[Exception]


_NOT_PLAIN = object()


def _plain_headers(headers: list[tuple[bytes, bytes]]) -> Any:
    """The declared ``Content-Length`` (None when absent) of a request whose headers the
    framework would pass to the route; ``_NOT_PLAIN`` for one whose length is no number or
    whose ``Host`` it refuses (the app answers those)."""
    declared: int | None = None
    seen_length = seen_host = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-length" and not seen_length:
            seen_length = True
            try:
                declared = int(value)
            except ValueError:
                return _NOT_PLAIN
            if declared < 0:
                return _NOT_PLAIN
        elif name == b"host" and not seen_host:
            seen_host = True
            if not is_valid_host(value):
                return _NOT_PLAIN
    return declared


def _skipped_steps(litestar: Litestar, handler: HTTPRouteHandler, rate_limited: bool) -> dict[str, list[Any]]:
    """What the framework would do for the route that the lane does not: every list must be empty."""
    # Litestar lists a route's middleware innermost first.
    expected = [*([RateLimitMiddleware] if rate_limited else []), JWTAuthenticationMiddleware]
    middleware = handler.resolve_middleware()
    classes = [getattr(m, "middleware", m) for m in middleware]
    sample_path = TOOL_CALLS_PATH.replace("{run_id}", "run_x")
    unauthenticated = [
        pattern
        for m in middleware
        if getattr(m, "middleware", None) is JWTAuthenticationMiddleware
        for pattern in m.kwargs.get("exclude") or []
        if re.search(pattern, sample_path)
    ]
    handlers = handler.resolve_exception_handlers()
    return {
        "the handler": [] if getattr(handler.fn, "__code__", None) is RunController.execute_tool_calls.fn.__code__
        and list(handler.parsed_fn_signature.parameters) == ["request", "run_id"] else [handler.fn],
        "guards": handler.resolve_guards(),
        "middleware": [] if classes == expected else classes,
        "paths excluded from authentication": unauthenticated
        + (["opt exclude_from_auth"] if handler.opt.get("exclude_from_auth") else []),
        "layered parameters": list(handler.resolve_layered_parameters()),
        # check_request reads only the query (the lane takes none) and a `data` field (the route has none)
        "before_request": [h for h in [handler.resolve_before_request()] if h not in (None, check_request)],
        "after_request": [layer.after_request for layer in handler.ownership_layers if layer.after_request],
        "after_response": [h for h in [handler.resolve_after_response()] if h is not None],
        "response_headers": list(handler.resolve_response_headers()),
        "response_cookies": list(handler.resolve_response_cookies()),
        "response cache": [handler.cache] if handler.cache else [],
        "exception handlers by status, or none for Exception": [k for k in handlers if isinstance(k, int)]
        + ([] if Exception in handlers else ["no Exception handler"]),
        "after_exception": list(litestar.after_exception),
        "pdb_on_exception": [True] if litestar.pdb_on_exception else [],
        "logging_config": [litestar.logging_config] if litestar.logging_config else [],
        "allowed_hosts": [litestar.allowed_hosts] if litestar.allowed_hosts else [],
        "cors": [litestar.cors_config] if litestar.cors_config else [],
        "csrf": [litestar.csrf_config] if litestar.csrf_config else [],
        "compression": [litestar.compression_config] if litestar.compression_config else [],
        # a plugin that wraps the app's handler (OpenTelemetry's does) would be passed by
        "a wrapped handler": [] if isinstance(litestar.asgi_handler, ExceptionHandlerMiddleware)
        and litestar.asgi_handler.app is litestar.asgi_router else [litestar.asgi_handler],
    }


def route_handler(litestar: Litestar) -> HTTPRouteHandler:
    """The handler of ``POST`` on the tool-calls route."""
    for route in litestar.routes:
        if isinstance(route, HTTPRoute) and route.path_format == TOOL_CALLS_PATH:
            for handler in route.route_handlers:
                if "POST" in handler.http_methods:
                    return handler
    raise LaneMismatch(f"the app has no POST {TOOL_CALLS_PATH}")
