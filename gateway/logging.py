"""structlog set-up: events with fields, bound request context, and redaction.

Request-scoped fields (request_id, tenant, user) live in one context variable holding a
dict: the request-context middleware starts a fresh one per request, authentication adds
tenant and user, and every event logged while the request is handled carries them. (One
variable and one dict per request is cheaper on the hot path than structlog's
one-variable-per-key contextvars.)
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from gateway.errors import new_error_id

# Keys whose values never reach a log line, wherever they appear in an event.
SECRET_KEYS = frozenset(
    {"authorization", "token", "jwt", "secret", "password", "api_key", "jwt_secret", "arguments_raw", "body"}
)
REDACTED = "[REDACTED]"


_request_context: ContextVar[dict[str, Any] | None] = ContextVar("gateway_request_context", default=None)


def start_request_context(**fields: Any) -> Token[dict[str, Any] | None]:
    return _request_context.set(dict(fields))


def end_request_context(token: Token[dict[str, Any] | None]) -> None:
    _request_context.reset(token)


def bind_request(**fields: Any) -> None:
    """Add fields to every later event of the current request."""
    context = _request_context.get()
    if context is not None:
        context.update(fields)


def merge_request_context(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    context = _request_context.get()
    if context:
        for key, value in context.items():
            event.setdefault(key, value)
    return event


def redact_secrets(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event.keys() & SECRET_KEYS:
        event[key] = REDACTED
    return event


_PID = os.getpid()


def enrich_event(logger: Any, method_name: str, event: dict[str, Any]) -> dict[str, Any]:
    """The request's context, the level, the process id, the time (ISO 8601, UTC) and the
    redaction of secrets, in one step: the hot path logs an event per tool call, and each
    processor of a chain is a call of its own."""
    merge_request_context(logger, method_name, event)
    event["level"] = "warning" if method_name == "warn" else method_name
    event["pid"] = _PID
    event["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return redact_secrets(logger, method_name, event)


def name_failure(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """Every event that carries an exception carries an ``error_id`` too: the one the client
    was given when the code that logged it made one, a new one otherwise (a failure logged
    by a library)."""
    if event.get("exc_info") and "error_id" not in event:
        event["error_id"] = new_error_id()
    return event


_DRIVER_PARAMETER = re.compile(r"(invalid input for query argument \$\d+: ).*")
"""asyncpg quotes the value of a parameter it cannot encode in its message, which
``hide_parameters`` does not reach: the rest of that line is dropped from logged stacks."""


def render_exception(logger: Any, method_name: str, event: dict[str, Any]) -> dict[str, Any]:
    """The exception as a readable stack under ``exception`` (never the bare exc_info tuple),
    whatever its text holds: a ``str()`` that raises or text UTF-8 cannot encode."""
    if not event.get("exc_info"):
        event.pop("exc_info", None)
        return event
    try:
        event = structlog.processors.format_exc_info(logger, method_name, event)
        if isinstance(event.get("exception"), str):
            event["exception"] = _DRIVER_PARAMETER.sub(r"\1[value hidden]", event["exception"])
        return event
    except Exception:  # noqa: BLE001 - the stack of an exception whose text cannot be made
        exc_info = event.pop("exc_info", None)
        error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if isinstance(error, BaseException):
            frames = "".join(traceback.format_tb(error.__traceback__))
            event["exception"] = f"{frames}{type(error).__module__}.{type(error).__qualname__}: (text unavailable)"
        return event


def shared_processors() -> list[Any]:
    return [enrich_event, name_failure]


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Configure structlog and the standard library root logger (uvicorn, alembic) alike."""
    global _PID
    _PID = os.getpid()
    numeric_level = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    if fmt == "json":
        # msgspec renders an event several times faster than the json module; the hot
        # path logs one event per tool call.
        final: Any = structlog.processors.JSONRenderer(serializer=_encode_event)
        factory: Any = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        final, factory = renderer, structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=[
            *shared_processors(),
            structlog.processors.StackInfoRenderer(),
            render_exception,
            final,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    # Records of the standard library (uvicorn, asyncio) get the same treatment: an error id
    # and a readable stack, not the repr of an exc_info tuple.
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, render_exception, renderer],
        foreign_pre_chain=[*shared_processors(), structlog.stdlib.add_logger_name],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)
    # uvicorn's access log duplicates our request events and logs raw paths with query strings.
    logging.getLogger("uvicorn.access").disabled = True
    # httpx logs every request's full URL at INFO (and httpcore its headers at DEBUG): an HTTP
    # tool's URL holds argument values, its headers a token. Our own events say what happened.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


_event_encoder = msgspec.json.Encoder(enc_hook=str)


def _encode_event(event: dict[str, Any], **_: Any) -> bytes:
    try:
        return _event_encoder.encode(event)
    except (UnicodeEncodeError, TypeError, ValueError):
        # A value UTF-8 cannot encode (a lone surrogate from some input): write it escaped
        # rather than lose the event.
        return _event_encoder.encode(_encodable(event))


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(str(k)): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    if isinstance(value, int | float | bool) or value is None:
        return value
    try:
        return _encodable(str(value))
    except Exception:  # noqa: BLE001 - a value whose str() fails
        return f"<{type(value).__name__}>"


def log_failure(event: str, exc: BaseException, *, error_id: str, **fields: Any) -> None:
    """Log ``exc`` with its stack under ``error_id``; this never raises, whatever ``exc`` holds."""
    logger = structlog.get_logger("gateway.http")
    try:
        logger.error(event, error_id=error_id, exc_info=exc, **fields)
    except Exception:  # noqa: BLE001 - the last resort must not fail: log what can be logged
        try:
            logger.error(event, error_id=error_id, error_type=type(exc).__qualname__)
        except Exception:  # noqa: BLE001
            pass


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
