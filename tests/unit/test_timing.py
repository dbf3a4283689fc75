"""The stage timer shared by callers that time nothing keeps no time."""

from __future__ import annotations

from gateway.observability.timing import AUTH, STAGES, TOOL, UNTIMED


def test_the_shared_untimed_timer_keeps_no_time_whoever_laps_it() -> None:
    UNTIMED.begin()
    UNTIMED.lap(AUTH)
    UNTIMED.lap(TOOL)
    assert UNTIMED.spent == [0.0] * len(STAGES)
    assert UNTIMED.touched is False
