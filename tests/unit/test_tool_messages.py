"""A ToolMessage carries, as values, what its content tells the model: nobody parses it back."""

from __future__ import annotations

from gateway.errors import ErrorCode
from gateway.execution.executor import message_of
from gateway.execution.guards import ADMISSION_CONTENTS
from gateway.execution.ledger import Admission
from gateway.execution.results import error_content, ok_content


def test_a_call_waiting_for_approval_carries_its_approval_id_and_the_same_content_as_before():
    admission = Admission(tool_call_id="c1", decision="decided", outcome="APPROVAL_REQUIRED", approval_id="apr_9")
    message = message_of("c1", admission)
    assert message.content == error_content(ErrorCode.APPROVAL_REQUIRED, approval_id="apr_9")
    assert message.approval_id == "apr_9"
    assert message.error is not None and message.error.code == "APPROVAL_REQUIRED"


def test_a_refusal_of_the_ledger_carries_its_code_message_and_retryable():
    content = ADMISSION_CONTENTS["BUDGET_EXCEEDED"]
    message = message_of("c1", Admission(tool_call_id="c1", decision="decided", outcome="BUDGET_EXCEEDED",
                                         content=content))
    assert message.content is content and message.approval_id is None
    assert message.error is not None and message.error.code == "BUDGET_EXCEEDED" and message.error.message


def test_a_replayed_business_error_carries_its_own_message():
    content = error_content(ErrorCode.CONFLICT, "The article changed meanwhile.")
    message = message_of("c1", Admission(tool_call_id="c1", decision="replay", outcome="CONFLICT", content=content))
    assert message.error is not None
    assert (message.error.code, message.error.message, message.error.retryable) == (
        "CONFLICT", "The article changed meanwhile.", False,
    )


def test_a_replayed_success_has_no_error():
    message = message_of("c1", Admission(tool_call_id="c1", decision="replay", outcome="OK",
                                         content=ok_content(b'{"x":1}')))
    assert message.error is None and message.approval_id is None
