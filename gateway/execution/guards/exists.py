"""``TOOL_NOT_FOUND``: the call names a tool this gateway offers (checked first, so an unknown
tool is not found whatever its arguments)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.errors import ErrorCode
from gateway.execution.guards.base import CheckContext, Guard, Stage
from gateway.observability.timing import POLICY

if TYPE_CHECKING:
    from gateway.execution.checks import CallPlan


def check(plan: CallPlan, context: CheckContext) -> str | None:
    tool = context.registry.get(plan.request.name)
    if tool is None:
        return f"No tool named {plan.request.name!r} exists."
    plan.tool = tool
    return None


GUARD = Guard(name="exists", stage=Stage.CHECK, code=ErrorCode.TOOL_NOT_FOUND, check=check, timed_as=POLICY)
