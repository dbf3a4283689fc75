"""Capturing what the gateway logs, rendered through its own processors (redaction included)."""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

from gateway.logging import render_exception, shared_processors


class CapturedLogs:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def capture(self, _: Any, __: str, event: MutableMapping[str, Any]) -> Any:
        self.events.append(dict(event))
        raise structlog.DropEvent

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    @property
    def text(self) -> str:
        """Everything logged, as the JSON lines production would write."""
        return "\n".join(json.dumps(e, default=str) for e in self.events)

    def install(self) -> None:
        structlog.configure(
            processors=[*shared_processors(), render_exception, self.capture],
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            cache_logger_on_first_use=False,
        )
