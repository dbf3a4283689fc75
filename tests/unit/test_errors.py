"""The one table of error codes: status, retryable, meaning, safe message."""

from __future__ import annotations

import pytest

from gateway.errors import ERRORS, TOOL_RESULT_CODES, ErrorCode, GatewayError, ToolError, markdown_table

EXPECTED = {
    # code: (HTTP status, retryable)
    "UNAUTHENTICATED": (401, False),
    "FORBIDDEN": (403, False),
    "NOT_FOUND": (404, False),
    "METHOD_NOT_ALLOWED": (405, False),
    "INVALID_REQUEST": (400, False),
    "PAYLOAD_TOO_LARGE": (413, False),
    "INVALID_TOOL_CALL": (422, False),
    "DUPLICATE_TOOL_CALL_ID": (422, False),
    "ALREADY_DECIDED": (409, False),
    "SELF_APPROVAL_FORBIDDEN": (403, False),
    "SERVICE_UNAVAILABLE": (503, True),
    "TOOL_NOT_FOUND": (404, False),
    "PERMISSION_DENIED": (403, False),
    "INVALID_ARGUMENTS": (422, False),
    "BUDGET_EXCEEDED": (429, False),
    "REPEATED_CALL": (429, False),
    "APPROVAL_REQUIRED": (202, False),
    "APPROVAL_REJECTED": (409, False),
    "APPROVAL_EXPIRED": (409, False),
    "TOOL_TIMEOUT": (504, True),
    "BUSINESS_RULE_VIOLATION": (422, False),
    "TOOL_EXECUTION_FAILED": (500, True),
}


def test_every_code_has_exactly_one_entry():
    assert set(ERRORS) == set(ErrorCode)
    assert all(spec.code is code for code, spec in ERRORS.items())


@pytest.mark.parametrize(("code", "expected"), EXPECTED.items())
def test_status_and_retryable_of_each_code(code, expected):
    spec = ERRORS[ErrorCode(code)]
    assert (spec.status, spec.retryable) == expected


def test_every_code_has_a_meaning_and_a_safe_default_message():
    for spec in ERRORS.values():
        assert spec.meaning.strip() and spec.message.strip()


def test_the_model_sees_only_tool_result_codes():
    assert ErrorCode.UNAUTHENTICATED not in TOOL_RESULT_CODES
    assert {ErrorCode.TOOL_TIMEOUT, ErrorCode.APPROVAL_REQUIRED, ErrorCode.BUSINESS_RULE_VIOLATION} <= TOOL_RESULT_CODES


def test_gateway_error_defaults_come_from_the_table():
    error = GatewayError(ErrorCode.PAYLOAD_TOO_LARGE)
    assert error.status == 413 and error.message == ERRORS[ErrorCode.PAYLOAD_TOO_LARGE].message


def test_tool_error_retryable_defaults_from_the_table_and_can_be_overridden():
    assert ToolError(ErrorCode.TOOL_TIMEOUT, "m").retryable is True
    assert ToolError(ErrorCode.TOOL_TIMEOUT, "m", retryable=False).retryable is False


def test_the_generated_table_lists_every_code():
    table = markdown_table()
    for code in ErrorCode:
        assert f"| `{code}` |" in table
