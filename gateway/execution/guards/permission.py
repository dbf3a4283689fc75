"""``PERMISSION_DENIED``: the caller may use the tool — the one visibility rule
(``gateway.execution.policy.is_visible``) that also decides what is listed, so what is
listed is exactly what may be called. Checked before the arguments, and the refusal
reveals nothing of the tool's schema."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode
from gateway.execution.guards.base import CheckContext, Guard, Stage
from gateway.execution.policy import is_visible
from gateway.observability.timing import POLICY
from gateway.tools.base import Tool

if TYPE_CHECKING:
    from gateway.execution.checks import CallPlan


def allows(principal: Principal, tool: Tool) -> bool:
    """Whether ``principal`` may see and call ``tool`` now (execution and approvals alike)."""
    policy = principal.tool_policies.for_tool(tool.name)
    return is_visible(tool, policy, permissions=principal.permissions, roles=principal.roles)


def check(plan: CallPlan, context: CheckContext) -> str | None:
    assert plan.tool is not None
    if allows(context.principal, plan.tool):
        return None
    return f"You are not allowed to use {plan.tool.name!r}."


GUARD = Guard(name="permission", stage=Stage.CHECK, code=ErrorCode.PERMISSION_DENIED, check=check, timed_as=POLICY)
