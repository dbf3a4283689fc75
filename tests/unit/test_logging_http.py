"""HTTP tool calls log events of their own; the HTTP client's request lines would leak."""

from __future__ import annotations

import logging

from gateway.logging import configure_logging
from tests.support.logging_state import logging_restored


def test_http_client_loggers_never_log_urls_or_headers_even_at_debug():
    with logging_restored():
        configure_logging("DEBUG", "json")
        for name in ("httpx", "httpcore", "httpcore.http11", "httpcore.connection"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger().isEnabledFor(logging.DEBUG)
