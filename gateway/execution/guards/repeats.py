"""``REPEATED_CALL``: the same call (tool and canonical arguments: its ``call_hash``) is
admitted at most ``max_repeats`` times per run. The admission statement counts per
(run, call_hash)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.errors import ErrorCode
from gateway.execution.guards.base import Guard, Stage
from gateway.execution.results import error_content
from gateway.tools.base import call_hash

if TYPE_CHECKING:
    from gateway.db.policies import ToolPolicy
    from gateway.execution.checks import CallPlan


def prepare(plan: CallPlan, policy: ToolPolicy) -> None:
    assert plan.tool is not None and plan.arguments is not None
    plan.call_hash = call_hash(plan.tool.name, plan.arguments.canonical)


def contribute(plan: CallPlan, payload: dict[str, Any]) -> None:
    payload["call_hash"] = plan.call_hash


GUARD = Guard(
    name="repeats",
    stage=Stage.ADMISSION,
    code=ErrorCode.REPEATED_CALL,
    prepare=prepare,
    contribute=contribute,
    contents={ErrorCode.REPEATED_CALL.value: error_content(ErrorCode.REPEATED_CALL)},
)
