"""Business rules that need no database: the calculator and the clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.errors import BusinessRuleViolation, ErrorCode
from gateway.services.calculator import MAX_SAFE_INTEGER, CalculatorService
from gateway.services.clock import ClockService


def test_division_by_zero_is_a_business_rule_violation():
    with pytest.raises(BusinessRuleViolation) as caught:
        CalculatorService().divide(1, 0)
    assert caught.value.code is ErrorCode.BUSINESS_RULE_VIOLATION and caught.value.retryable is False


def test_exact_division_stays_an_integer():
    assert CalculatorService().divide(10, 2) == 5 and isinstance(CalculatorService().divide(10, 2), int)
    assert CalculatorService().divide(1, 4) == 0.25


def test_results_beyond_exact_json_numbers_are_refused():
    with pytest.raises(BusinessRuleViolation):
        CalculatorService().multiply(MAX_SAFE_INTEGER, 2)
    assert CalculatorService().add(MAX_SAFE_INTEGER - 1, 1) == MAX_SAFE_INTEGER


def test_the_clock_answers_utc():
    moment = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert ClockService(lambda: moment).current_time() == {
        "utc": "2030-01-02T03:04:05Z", "unix": int(moment.timestamp()), "timezone": "UTC"
    }
