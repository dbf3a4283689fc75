"""Tests that run code calling ``configure_logging`` put the process's logging back after."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import structlog


@contextmanager
def logging_restored() -> Iterator[None]:
    root = logging.getLogger()
    names = ("httpx", "httpcore", "uvicorn.access")
    loggers = {name: (logging.getLogger(name).level, logging.getLogger(name).disabled) for name in names}
    saved = (root.handlers[:], root.level, loggers)
    try:
        yield
    finally:
        handlers, level, loggers = saved
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, (logger_level, disabled) in loggers.items():
            logging.getLogger(name).setLevel(logger_level)
            logging.getLogger(name).disabled = disabled
        structlog.reset_defaults()
