"""Where a request's time goes, stage by stage, answered in a ``Server-Timing`` header.

A ``StageTimer`` is made per HTTP request by the request-context middleware and filled in
as the request walks the path: the auth middleware closes ``auth``; the executor closes
``validation``, ``policy``, ``budget``, ``tool`` and ``audit``. Each stage boundary is one
``perf_counter()`` call and one addition into a preallocated list: no objects per stage,
no dictionaries, no strings until the header is rendered once at response start.

``lap(stage)`` adds the time since the previous boundary to ``stage`` (repeated laps of a
stage add up, e.g. the per-call checks of a batch); ``begin()`` marks a boundary without
charging the gap to any stage (routing, reading the body). ``total`` runs from the
timer's creation to the start of the response, so ``total`` minus the stages is the
framework's share.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

AUTH = 0
VALIDATION = 1
POLICY = 2
BUDGET = 3
TOOL = 4
AUDIT = 5
STAGES = ("auth", "validation", "policy", "budget", "tool", "audit")
"""Stage names by index, in the order a request meets them; the header keeps this order."""


def elapsed_ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``perf_counter()`` value), to the microsecond."""
    return round((perf_counter() - started) * 1000, 3)


class StageTimer:
    __slots__ = ("started", "last", "spent", "touched")

    def __init__(self) -> None:
        self.started = self.last = perf_counter()
        self.spent = [0.0] * len(STAGES)
        self.touched = False

    def begin(self) -> None:
        """Start timing from now; the time since the previous boundary is charged to no stage."""
        self.last = perf_counter()

    def lap(self, stage: int) -> None:
        """Charge the time since the previous boundary to ``stage``."""
        now = perf_counter()
        self.spent[stage] += now - self.last
        self.last = now
        self.touched = True

    def total_s(self) -> float:
        return perf_counter() - self.started

    def header_value(self) -> bytes:
        """``auth;dur=0.041, validation;dur=0.012, ..., total;dur=1.734`` (milliseconds)."""
        stages = ", ".join(f"{name};dur={spent * 1000:.3f}" for name, spent in zip(STAGES, self.spent))
        return f"{stages}, total;dur={self.total_s() * 1000:.3f}".encode()


class _Untimed(StageTimer):
    """A timer whose boundaries change nothing, so that one can be shared by every caller."""

    __slots__ = ()

    def begin(self) -> None:
        pass

    def lap(self, stage: int) -> None:
        pass


UNTIMED: StageTimer = _Untimed()
"""A timer nobody reads: the default where a caller (a test, the agent loop) times nothing.
Shared by every app of the process, so it keeps no time: its laps change nothing."""

SERVER_TIMING_HEADER = b"server-timing"
STATE_KEY = "stage_timer"


def timer_of(scope: Any) -> StageTimer:
    """The request's timer, or ``UNTIMED`` where the request-context middleware made none."""
    state = scope.get("state")
    return state.get(STATE_KEY, UNTIMED) if state is not None else UNTIMED
