"""structlog set-up: events with fields, bound request context, and redaction.

Request-scoped fields (request_id, tenant, user) are bound through
``structlog.contextvars`` by the request-context middleware; every event logged while a
request is handled carries them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import msgspec
import structlog

# Keys whose values never reach a log line, wherever they appear in an event.
SECRET_KEYS = frozenset(
    {"authorization", "token", "jwt", "secret", "password", "api_key", "jwt_secret", "arguments_raw", "body"}
)
REDACTED = "[REDACTED]"


def redact_secrets(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event.keys() & SECRET_KEYS:
        event[key] = REDACTED
    return event


def add_process_id(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """With several worker processes, tells which one logged the event."""
    event["pid"] = _PID
    return event


_PID = os.getpid()


def shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        add_process_id,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]


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
            structlog.processors.format_exc_info,
            final,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        processor=renderer,
        foreign_pre_chain=[*shared_processors(), structlog.stdlib.add_logger_name],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)
    # uvicorn's access log duplicates our request events and logs raw paths with query strings.
    logging.getLogger("uvicorn.access").disabled = True


_event_encoder = msgspec.json.Encoder(enc_hook=str)


def _encode_event(event: dict[str, Any], **_: Any) -> bytes:
    return _event_encoder.encode(event)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
