"""HTTP tool calls log events of their own; the HTTP client's request lines would leak."""

from __future__ import annotations

import logging

import structlog

from gateway.logging import configure_logging


def test_http_client_loggers_never_log_urls_or_headers_even_at_debug():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpcore")})
    configure_logging("DEBUG", "json")
    try:
        for name in ("httpx", "httpcore", "httpcore.http11", "httpcore.connection"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert root.isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:], level, levels = saved
        root.setLevel(level)
        for name, value in levels.items():
            logging.getLogger(name).setLevel(value)
        logging.getLogger("uvicorn.access").disabled = False
        structlog.reset_defaults()
