"""The ``result_cap`` guard: a result over the call's limit is cut, visibly, never refused."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.execution.guards import result_cap
from gateway.execution.guards.result_cap import TRUNCATION_MARKER, encode_result
from gateway.tools.base import PartialResult, ToolContext
from tests.unit.guards.support import MEMBER_PRINCIPAL, REGISTRY


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


def test_a_partial_result_of_unknown_size_is_truncated_without_an_original_size():
    content = json.loads(encode_result(PartialResult(kept=b"abcdef", original_bytes=None), max_bytes=4))
    assert content == {"ok": True, "result": "abcd" + TRUNCATION_MARKER, "truncated": True}


async def test_around_a_call_it_caps_with_the_call_s_limit():
    async def large(tool, arguments, context):
        return "z" * 100

    ctx = ToolContext(principal=MEMBER_PRINCIPAL, run_id="r", tool_call_id="c", request_id=None, db=None,
                      max_result_bytes=20)  # type: ignore[arg-type]
    content = json.loads(await result_cap.around(large)(REGISTRY.get("add"), None, ctx))
    assert content["truncated"] is True and content["original_bytes"] == 102


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
