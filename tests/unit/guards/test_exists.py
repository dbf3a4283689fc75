"""The ``exists`` guard: TOOL_NOT_FOUND for a name the gateway does not offer."""

from __future__ import annotations

from gateway.errors import ErrorCode
from gateway.execution.checks import CallPlan
from gateway.execution.guards import exists
from gateway.execution.protocol import ToolCallRequest
from tests.unit.guards.support import REGISTRY, context


def test_an_unknown_name_is_refused_with_tool_not_found_naming_it():
    plan = CallPlan(request=ToolCallRequest(id="c", name="drop_tables", arguments=b"not json"))
    assert exists.check(plan, context()) == "No tool named 'drop_tables' exists."
    assert plan.tool is None and exists.GUARD.code is ErrorCode.TOOL_NOT_FOUND


def test_a_known_name_passes_and_puts_the_tool_on_the_plan():
    plan = CallPlan(request=ToolCallRequest(id="c", name="add", arguments=b"{}"))
    assert exists.check(plan, context()) is None
    assert plan.tool is REGISTRY.get("add")
