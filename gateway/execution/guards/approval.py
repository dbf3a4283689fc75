"""``APPROVAL_REQUIRED``: the tenant's policy decides whether a call waits for an
administrator (``gateway.execution.policy.needs_approval``). Such a call gets its approval
id here; the admission statement freezes it — the canonical arguments as text, byte for
byte what was hashed (JSONB would rewrite numbers) — and answers with the id."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from gateway.errors import ErrorCode
from gateway.execution.guards.base import Guard, Stage
from gateway.execution.policy import needs_approval

if TYPE_CHECKING:
    from gateway.db.policies import ToolPolicy
    from gateway.execution.checks import CallPlan


def prepare(plan: CallPlan, policy: ToolPolicy) -> None:
    assert plan.tool is not None
    if needs_approval(plan.tool, policy):
        plan.needs_approval = True
        plan.approval_id = "apr_" + uuid.uuid4().hex


def contribute(plan: CallPlan, payload: dict[str, Any]) -> None:
    payload["needs_approval"] = plan.needs_approval
    payload["approval_id"] = plan.approval_id
    if plan.needs_approval:
        assert plan.arguments is not None
        payload["arguments"] = plan.arguments.canonical.decode()


GUARD = Guard(
    name="approval", stage=Stage.ADMISSION, code=ErrorCode.APPROVAL_REQUIRED, prepare=prepare, contribute=contribute
)
