"""Per-call checks in the order the model sees their codes:
TOOL_NOT_FOUND, then PERMISSION_DENIED, then INVALID_ARGUMENTS."""

from __future__ import annotations

import json

from gateway.auth.principal import Principal
from gateway.demo import EDITOR, MEMBER
from gateway.errors import ErrorCode
from gateway.execution.checks import plan_call
from gateway.execution.protocol import ToolCallRequest
from gateway.tools.base import call_hash, sha256_hex
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry

REGISTRY = ToolRegistry(builtin_tools())
MEMBER_PRINCIPAL = Principal(tenant_id="acme", user_id="alice", roles=frozenset({"member"}), permissions=MEMBER)
EDITOR_PRINCIPAL = Principal(tenant_id="acme", user_id="bob", roles=frozenset({"editor"}), permissions=EDITOR)


def request(name: str, arguments: bytes | str = b"{}") -> ToolCallRequest:
    raw = arguments.encode() if isinstance(arguments, str) else arguments
    return ToolCallRequest(id="call_1", name=name, arguments=raw)


def message_of(plan) -> str:
    return json.loads(plan.rejection_content)["error"]["message"]


def test_an_unknown_tool_is_tool_not_found_even_with_bad_arguments():
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("drop_tables", b"not json"))
    assert plan.rejected is ErrorCode.TOOL_NOT_FOUND


def test_a_tool_that_exists_but_is_not_granted_is_permission_denied_not_tool_not_found():
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("delete_article", '{"article_id": "a1"}'))
    assert plan.rejected is ErrorCode.PERMISSION_DENIED


def test_permission_is_checked_before_arguments():
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("create_article", '{"user_id": "carol"}'))
    assert plan.rejected is ErrorCode.PERMISSION_DENIED


def test_a_denied_tool_reveals_nothing_of_its_schema():
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("update_article", "{}"))
    content = plan.rejection_content
    for word in ("article_id", "properties", "title", "body", "required", "articles:write"):
        assert word not in content


def test_invalid_arguments_come_last_and_name_the_field():
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("add", '{"a": "5", "b": 1}'))
    assert plan.rejected is ErrorCode.INVALID_ARGUMENTS
    assert "`a`" in message_of(plan)


def test_identity_fields_in_arguments_are_invalid_arguments():
    plan = plan_call(REGISTRY, EDITOR_PRINCIPAL, request("create_article", '{"title": "t", "body": "b", "tenant_id": "globex"}'))
    assert plan.rejected is ErrorCode.INVALID_ARGUMENTS
    assert "`tenant_id`" in message_of(plan)


def test_a_rejected_call_stores_only_the_hash_of_its_raw_arguments():
    raw = b'{"a": "5", "b": 1, "password": "hunter2"}'
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("add", raw))
    assert plan.audit_arguments is None and plan.arguments is None
    assert plan.arguments_sha256 == sha256_hex(raw)


def test_a_call_that_passes_is_planned_with_canonical_arguments():
    plan = plan_call(REGISTRY, MEMBER_PRINCIPAL, request("add", '{"b": 2, "a": 1}'))
    assert plan.rejected is None
    assert plan.arguments.canonical == b'{"a":1,"b":2}'
    assert plan.arguments_sha256 == sha256_hex(b'{"a":1,"b":2}')
    assert plan.call_hash == call_hash("add", b'{"a":1,"b":2}')
    assert plan.audit_arguments_value() == {"a": 1, "b": 2}
    assert plan.needs_approval is False


def test_a_mutating_tool_is_planned_for_approval():
    plan = plan_call(REGISTRY, EDITOR_PRINCIPAL, request("delete_article", '{"article_id": "a1"}'))
    assert plan.rejected is None and plan.needs_approval is True
