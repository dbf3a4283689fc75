"""The ``budget`` guard: BUDGET_EXCEEDED past the run's max_tool_calls, counted by the admission
statement on the run's row (exact under concurrency: tests/integration/test_concurrency.py,
tests/api/test_tool_calls_accounting.py); here, what it gives that statement."""

from __future__ import annotations

import json

from gateway.errors import ERRORS, ErrorCode
from gateway.execution.guards import ADMISSION_CONTENTS, Stage, budget


def test_it_is_decided_at_admission_with_the_code_s_own_message():
    assert budget.GUARD.stage is Stage.ADMISSION and budget.GUARD.code is ErrorCode.BUDGET_EXCEEDED
    error = json.loads(ADMISSION_CONTENTS["BUDGET_EXCEEDED"])["error"]
    assert error == {"code": "BUDGET_EXCEEDED", "message": ERRORS[ErrorCode.BUDGET_EXCEEDED].message,
                     "retryable": ERRORS[ErrorCode.BUDGET_EXCEEDED].retryable}


def test_it_needs_no_input_of_its_own_per_call():
    assert budget.GUARD.prepare is None and budget.GUARD.contribute is None
