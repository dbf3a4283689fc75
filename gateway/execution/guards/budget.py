"""``BUDGET_EXCEEDED``: a run admits at most its ``max_tool_calls`` calls. Counted by the
admission statement on the run's row, under its lock (exact across replicas); no per-call
input."""

from __future__ import annotations

from gateway.errors import ErrorCode
from gateway.execution.guards.base import Guard, Stage
from gateway.execution.results import error_content

GUARD = Guard(
    name="budget",
    stage=Stage.ADMISSION,
    code=ErrorCode.BUDGET_EXCEEDED,
    contents={ErrorCode.BUDGET_EXCEEDED.value: error_content(ErrorCode.BUDGET_EXCEEDED)},
)
