"""The content of a role=tool message, and results cut to the tool's limit."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ERRORS, ErrorCode
from gateway.execution.results import LEDGER_CONTENTS, TRUNCATION_MARKER, encode_result, error_content, ok_content


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


def test_a_result_within_the_limit_is_not_truncated():
    assert json.loads(encode_result({"a": "x" * 10}, max_bytes=100)) == {"ok": True, "result": {"a": "x" * 10}}


def test_a_result_over_the_limit_is_truncated_with_a_marker_and_its_original_size():
    result = {"text": "y" * 500}
    content = json.loads(encode_result(result, max_bytes=50))
    original = len(json.dumps(result, separators=(",", ":")).encode())
    assert content["ok"] is True
    assert content["truncated"] is True
    assert content["original_bytes"] == original
    assert content["result"].endswith(TRUNCATION_MARKER)
    assert len(content["result"].removesuffix(TRUNCATION_MARKER).encode()) <= 50


def test_truncation_never_splits_a_multibyte_character():
    content = json.loads(encode_result("é" * 100, max_bytes=10))
    kept = content["result"].removesuffix(TRUNCATION_MARKER)
    assert set(kept) <= {'"', "é"}
    assert content["original_bytes"] == len(json.dumps("é" * 100, ensure_ascii=False).encode())


def test_ledger_outcomes_have_fixed_contents():
    for code in ("RUN_EXPIRED", "BUDGET_EXCEEDED", "REPEATED_CALL"):
        assert json.loads(LEDGER_CONTENTS[code])["error"]["code"] == code


json_results = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(result=json_results, max_bytes=st.integers(min_value=1, max_value=200))
def test_any_result_becomes_valid_json_content_and_truncation_says_so(result, max_bytes):
    content = json.loads(encode_result(result, max_bytes=max_bytes))
    assert content["ok"] is True
    size = len(json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode())
    if size <= max_bytes:
        assert content == {"ok": True, "result": result}
    else:
        assert content["truncated"] is True and content["original_bytes"] == size
