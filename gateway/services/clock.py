"""The current time, in UTC."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime


class ClockService:
    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._now = now

    def current_time(self) -> dict[str, object]:
        now = self._now()
        return {"utc": now.isoformat().replace("+00:00", "Z"), "unix": int(now.timestamp()), "timezone": "UTC"}
