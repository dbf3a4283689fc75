"""``BUDGET_EXCEEDED`` (a tool's own): the tenant's policy may cap the calls of one tool per
run (``max_calls_per_run``, the tool's effective limit). The admission statement counts
admitted calls per (run, tool) and refuses past the cap, with its own message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.errors import ErrorCode
from gateway.execution.guards.base import Guard, Stage
from gateway.execution.results import error_content

if TYPE_CHECKING:
    from gateway.db.policies import ToolPolicy
    from gateway.execution.checks import CallPlan

CONTENT_KEY = "TOOL_BUDGET_EXCEEDED"
"""The key of its answer in the statement's contents (the code is ``BUDGET_EXCEEDED``)."""


def prepare(plan: CallPlan, policy: ToolPolicy) -> None:
    plan.tool_call_cap = plan.limits.max_calls_per_run


def contribute(plan: CallPlan, payload: dict[str, Any]) -> None:
    if plan.tool_call_cap is not None:
        payload["tool_cap"] = plan.tool_call_cap


GUARD = Guard(
    name="tool_budget",
    stage=Stage.ADMISSION,
    code=ErrorCode.BUDGET_EXCEEDED,
    prepare=prepare,
    contribute=contribute,
    contents={CONTENT_KEY: error_content(ErrorCode.BUDGET_EXCEEDED, "This tool's call limit for this run is used up.")},
)
