"""The ``approval`` guard: APPROVAL_REQUIRED for a call the tenant's policy holds back. The
statement creates the approval (tests/api/test_approvals*.py); here, what is decided in Python
and frozen: the id and the canonical arguments as text."""

from __future__ import annotations

from gateway.db.policies import DEFAULT_POLICY, ApprovalMode, ToolPolicy
from gateway.errors import ErrorCode
from gateway.execution.guards import admission_payload, approval
from tests.unit.guards.support import plan


def prepared(name: str, arguments: bytes, policy: ToolPolicy):
    call = plan(name, arguments, decoded=True)
    approval.prepare(call, policy)
    return call


def test_a_mutating_tool_waits_by_default_with_a_fresh_approval_id_and_its_frozen_arguments():
    call = prepared("create_article", b'{"body": "b", "title": "1e16"}', DEFAULT_POLICY)
    payload = admission_payload(call)
    assert payload["needs_approval"] is True and payload["approval_id"].startswith("apr_")
    assert payload["arguments"] == '{"body":"b","title":"1e16"}'
    assert approval.GUARD.code is ErrorCode.APPROVAL_REQUIRED


def test_each_call_gets_its_own_approval_id():
    first = prepared("create_article", b'{"title": "t", "body": "b"}', DEFAULT_POLICY)
    second = prepared("create_article", b'{"title": "t", "body": "b"}', DEFAULT_POLICY)
    assert first.approval_id != second.approval_id


def test_a_reading_tool_does_not_wait_unless_the_policy_says_always():
    assert admission_payload(prepared("add", b'{"a": 1, "b": 2}', DEFAULT_POLICY))["needs_approval"] is False
    always = prepared("add", b'{"a": 1, "b": 2}', ToolPolicy(approval_mode=ApprovalMode.ALWAYS))
    assert admission_payload(always)["needs_approval"] is True


def test_a_mutating_tool_the_operator_let_run_freely_does_not_wait():
    waived = ToolPolicy(approval_mode=ApprovalMode.NEVER, approval_waived=True)
    never = prepared("create_article", b'{"title": "t", "body": "b"}', waived)
    payload = admission_payload(never)
    assert payload["needs_approval"] is False and payload["approval_id"] is None and "arguments" not in payload


def test_never_without_the_operators_waiver_is_mutating_for_a_tool_that_changes_data():
    unwaived = prepared("create_article", b'{"title": "t", "body": "b"}', ToolPolicy(approval_mode=ApprovalMode.NEVER))
    assert admission_payload(unwaived)["needs_approval"] is True
    read_only = prepared("add", b'{"a": 1, "b": 2}', ToolPolicy(approval_mode=ApprovalMode.NEVER))
    assert admission_payload(read_only)["needs_approval"] is False
