"""The content of a role=tool message, and reading it back from storage."""

from __future__ import annotations

import json

import pytest

from gateway.api.approvals import outcome_view
from gateway.errors import ERRORS, ErrorCode
from gateway.execution.results import error_content, ok_content, read_content


def test_ok_content_wraps_the_result():
    assert json.loads(ok_content(b'{"x":1}')) == {"ok": True, "result": {"x": 1}}


def test_error_content_carries_code_message_and_retryable():
    content = json.loads(error_content(ErrorCode.TOOL_TIMEOUT))
    assert content == {
        "ok": False,
        "error": {"code": "TOOL_TIMEOUT", "message": ERRORS[ErrorCode.TOOL_TIMEOUT].message, "retryable": True},
    }


def test_error_content_carries_approval_id_and_error_id_only_when_given():
    with_ids = json.loads(error_content(ErrorCode.APPROVAL_REQUIRED, approval_id="apr_1", error_id="err_2"))
    assert with_ids["error"]["approval_id"] == "apr_1" and with_ids["error"]["error_id"] == "err_2"
    without = json.loads(error_content(ErrorCode.APPROVAL_REQUIRED))["error"]
    assert "approval_id" not in without and "error_id" not in without


def test_read_content_gives_back_the_error_that_error_content_wrote():
    content = error_content(ErrorCode.APPROVAL_REQUIRED, "Wait.", approval_id="apr_1")
    stored = read_content(content)
    assert stored.ok is False and stored.error is not None
    assert (stored.error.code, stored.error.message, stored.error.retryable, stored.error.approval_id) == (
        "APPROVAL_REQUIRED", "Wait.", ERRORS[ErrorCode.APPROVAL_REQUIRED].retryable, "apr_1",
    )


def test_read_content_gives_back_a_result():
    stored = read_content(ok_content(b'{"x":[1,2]}'))
    assert stored.ok is True and stored.result == {"x": [1, 2]} and stored.error is None


@pytest.mark.parametrize(
    ("code", "content"),
    [("OK", '{"ok":true,"result":{"amount":1e400}}'), ("OK", "not json"),
     ("CONFLICT", '{"ok":false}'), ("CONFLICT", '{"ok":false,"error":[1e999]}')],
    ids=["number-past-a-float", "not-json", "failure-without-error", "error-unreadable"],
)
def test_an_approval_outcome_stored_by_an_older_version_reads_as_its_text(code, content):
    # An older version stored a service's JSON as sent, 1e400 included: the approval still reads.
    outcome = outcome_view(code, content)
    assert outcome is not None and outcome.code == code
    assert outcome.ok is (code == "OK") and outcome.result == content
