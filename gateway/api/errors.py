"""Every HTTP error leaves in one envelope: ``{"error": {"code", "message", "request_id"}}``.

Unknown routes, wrong methods, invalid bodies, oversized bodies, a database that is down
and unexpected exceptions included. A stack trace never leaves the process: a 5xx is
logged with its stack under the ``error_id`` the client receives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from sqlalchemy import exc as sa_exc

from gateway.api.context import request_id_of
from gateway.api.schemas import ErrorBody, ErrorEnvelope
from gateway.errors import ERRORS, ErrorCode, GatewayError, new_error_id
from gateway.logging import log_failure
from gateway.observability.metrics import Metrics
from gateway.text import quoted

log = structlog.get_logger("gateway.http")

CLIENT_DISCONNECTED = "client disconnected prematurely"
"""What Litestar's request says when the body stream ends early."""

_STATUS_CODES = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    429: ErrorCode.RATE_LIMITED,
    503: ErrorCode.SERVICE_UNAVAILABLE,
}


def error_response(
    request: Request[Any, Any, Any],
    code: ErrorCode,
    message: str | None,
    status: int,
    *,
    headers: dict[str, str] | None = None,
    error_id: str | None = None,
) -> Response[ErrorEnvelope]:
    body = ErrorBody(
        code=code.value,
        message=message or ERRORS[code].message,
        request_id=request_id_of(request.scope),
        error_id=error_id,
    )
    return Response(
        content=ErrorEnvelope(error=body), status_code=status, headers=headers, media_type=MediaType.JSON
    )


def handle_gateway_error(request: Request, exc: GatewayError) -> Response[ErrorEnvelope]:
    return error_response(request, exc.code, exc.message, exc.status, headers=exc.headers)


def handle_validation_error(request: Request, exc: ValidationException) -> Response[ErrorEnvelope]:
    """A path or query parameter Litestar could not convert (bodies are decoded and described
    in ``gateway.api.decoding``): name the parameter and what it expects."""
    problems = []
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if isinstance(item, dict):
            source = item.get("source")
            name = quoted(str(item.get("key") or "?"))
            what = quoted(str(item.get("message") or "invalid"), 200)
            what = what[:1].lower() + what[1:]
            if source == "body":
                problems.append(f"the body: {what}")
            else:
                kind = getattr(source, "value", source) or "request"
                problems.append(f"{kind} parameter `{name}`: {what}")
    message = "Invalid " + "; ".join(problems) + "." if problems else None
    return error_response(request, ErrorCode.INVALID_REQUEST, message[:500] if message else None, 400)


def handle_http_exception(request: Request, exc: HTTPException) -> Response[ErrorEnvelope]:
    status = exc.status_code
    if exc.detail == CLIENT_DISCONNECTED:
        # The client went away while sending its body: nothing to answer, nothing went wrong here.
        log.info("client_disconnected", path=request.url.path)
        return error_response(request, ErrorCode.INVALID_REQUEST, "The client disconnected.", 400)
    if status >= 500:
        return handle_unexpected(request, exc)
    code = _STATUS_CODES.get(status, ErrorCode.INVALID_REQUEST)
    return error_response(request, code, None, status, headers=exc.headers or None)


def handle_unexpected(request: Request, exc: Exception) -> Response[ErrorEnvelope]:
    """The last resort: it cannot fail. Whatever the exception holds (a ``str()`` that raises,
    text UTF-8 cannot encode), the client gets the envelope with ``INTERNAL_ERROR``, the
    request id and an error id, and the log gets the stack under that error id."""
    error_id = new_error_id()
    try:
        if is_database_unavailable(exc):
            log.warning("database_unavailable", error_id=error_id, error_type=type(exc).__name__)
            return error_response(
                request, ErrorCode.SERVICE_UNAVAILABLE, None, 503, headers={"Retry-After": "1"}, error_id=error_id
            )
    except Exception:  # noqa: BLE001 - looking at the exception failed: it is an internal error
        pass
    log_failure("unhandled_exception", exc, error_id=error_id, path=request.scope.get("path"))
    try:
        return error_response(request, ErrorCode.INTERNAL_ERROR, None, 500, error_id=error_id)
    except Exception:  # noqa: BLE001 - the envelope without the extras that failed
        body = ErrorBody(code=ErrorCode.INTERNAL_ERROR.value, message=ERRORS[ErrorCode.INTERNAL_ERROR].message,
                         request_id=request_id_of(request.scope), error_id=error_id)
        return Response(content=ErrorEnvelope(error=body), status_code=500, media_type=MediaType.JSON)


def is_database_unavailable(exc: BaseException) -> bool:
    """Errors that mean "the database cannot be reached now", not "the query was wrong"."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, sa_exc.TimeoutError | ConnectionError | TimeoutError):
            return True
        if isinstance(current, OSError) and current.errno is not None:
            return True
        module = type(current).__module__
        if module.startswith("asyncpg") and type(current).__name__ in _ASYNCPG_UNAVAILABLE:
            return True
        if isinstance(current, sa_exc.OperationalError) and "database is locked" not in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


_ASYNCPG_UNAVAILABLE = frozenset(
    {
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
        "ConnectionFailureError",
        "InterfaceError",
        "AdminShutdownError",
        "CrashShutdownError",
        "TooManyConnectionsError",
        "PostgresConnectionError",
    }
)

ErrorHandler = Callable[[Request[Any, Any, Any], Any], Response[ErrorEnvelope]]

_HANDLERS: dict[type[Exception], ErrorHandler] = {
    GatewayError: handle_gateway_error,
    ValidationException: handle_validation_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}


def exception_handlers(metrics: Metrics) -> dict[type[Exception], ErrorHandler]:
    """One app's exception handlers: each answers the envelope and counts its code in that app's metrics."""

    def counted(handler: ErrorHandler) -> ErrorHandler:
        def answer(request: Request[Any, Any, Any], exc: Any) -> Response[ErrorEnvelope]:
            response = handler(request, exc)
            try:
                metrics.http_error(response.content.error.code)
            except Exception:  # noqa: BLE001 - counting must not turn an answer into a failure
                log.warning("http_error_not_counted", exc_info=True)
            return response

        return answer

    return {exc_type: counted(handler) for exc_type, handler in _HANDLERS.items()}
