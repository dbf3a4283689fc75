"""The one list of guards: its order is the order the model sees their codes."""

from __future__ import annotations

from gateway.errors import ErrorCode
from gateway.execution.guards import CHECKS, GUARDS, Stage
from gateway.execution.checks import plan_call
from gateway.execution.protocol import ToolCallRequest
from tests.unit.guards.support import MEMBER_PRINCIPAL, REGISTRY


def test_the_codes_come_in_the_order_the_model_sees_them():
    assert [g.code for g in GUARDS] == [
        ErrorCode.TOOL_NOT_FOUND,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.INVALID_ARGUMENTS,
        ErrorCode.RUN_EXPIRED,
        ErrorCode.BUDGET_EXCEEDED,
        ErrorCode.BUDGET_EXCEEDED,
        ErrorCode.REPEATED_CALL,
        ErrorCode.APPROVAL_REQUIRED,
        ErrorCode.TOOL_TIMEOUT,
        None,
    ]


def test_checks_come_before_admission_and_admission_before_execution():
    stages = [g.stage for g in GUARDS]
    assert stages == sorted(stages, key=[Stage.CHECK, Stage.ADMISSION, Stage.EXECUTION].index)
    assert len(CHECKS) == stages.count(Stage.CHECK)


def test_each_guard_has_its_own_name_and_what_its_stage_needs():
    assert len({g.name for g in GUARDS}) == len(GUARDS)
    for guard in GUARDS:
        if guard.stage is Stage.CHECK:
            assert guard.check is not None and guard.code is not None
        if guard.stage is Stage.EXECUTION:
            assert guard.around is not None


def test_the_first_check_that_refuses_decides_the_code():
    # Unknown tool with broken arguments: TOOL_NOT_FOUND; a denied tool with broken ones: PERMISSION_DENIED.
    unknown = plan_call(REGISTRY, MEMBER_PRINCIPAL, ToolCallRequest(id="c", name="nope", arguments=b"]"))
    denied = plan_call(REGISTRY, MEMBER_PRINCIPAL, ToolCallRequest(id="c", name="delete_article", arguments=b"]"))
    assert (unknown.rejected, denied.rejected) == (ErrorCode.TOOL_NOT_FOUND, ErrorCode.PERMISSION_DENIED)
