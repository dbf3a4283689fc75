"""The ``tool_budget`` guard: BUDGET_EXCEEDED past the tenant's per-run cap on one tool. The
statement counts per (run, tool) (tests/api/test_tool_policies.py); here, the cap it is given."""

from __future__ import annotations

import json

from gateway.db.policies import DEFAULT_POLICY, ToolPolicy
from gateway.errors import ErrorCode
from gateway.execution.guards import ADMISSION_CONTENTS, admission_payload, tool_budget
from gateway.execution.policy import tool_limits
from tests.unit.guards.support import REGISTRY, plan


def prepared(policy: ToolPolicy):
    call = plan("add", b'{"a": 1, "b": 2}', decoded=True)
    call.limits = tool_limits(REGISTRY.get("add"), policy)
    tool_budget.prepare(call, policy)
    return call


def test_a_policy_s_cap_is_given_to_the_statement():
    assert admission_payload(prepared(ToolPolicy(max_calls_per_run=3)))["tool_cap"] == 3


def test_without_a_cap_nothing_is_given():
    assert "tool_cap" not in admission_payload(prepared(DEFAULT_POLICY))


def test_its_answer_is_budget_exceeded_saying_it_is_this_tool_s_limit():
    assert tool_budget.GUARD.code is ErrorCode.BUDGET_EXCEEDED
    error = json.loads(ADMISSION_CONTENTS[tool_budget.CONTENT_KEY])["error"]
    assert error["code"] == "BUDGET_EXCEEDED" and error["message"] == "This tool's call limit for this run is used up."
