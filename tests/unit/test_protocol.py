"""Protocol checks on a whole batch: any breach rejects the batch before anything runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ErrorCode
from gateway.execution.protocol import (
    MAX_TOOL_CALL_ID_LENGTH,
    FunctionCallIn,
    ProtocolError,
    ToolCallIn,
    ToolCallRequest,
    call_problem,
    check_calls,
    parse_batch,
)


def body(*calls: Any) -> bytes:
    return json.dumps({"tool_calls": list(calls)}).encode()


def call(call_id: Any = "c1", name: Any = "add", arguments: Any = '{"a": 1, "b": 2}', type_: Any = "function") -> dict:
    return {"id": call_id, "type": type_, "function": {"name": name, "arguments": arguments}}


def rejection(raw: bytes, *, max_batch_size: int = 64) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_batch(raw, max_batch_size=max_batch_size)
    return caught.value


def test_a_well_formed_batch_keeps_the_given_order():
    parsed = parse_batch(body(call("b"), call("a"), call("c")), max_batch_size=64)
    assert [r.id for r in parsed] == ["b", "a", "c"]
    assert parsed[0] == ToolCallRequest(id="b", name="add", arguments=b'{"a": 1, "b": 2}')


def test_arguments_given_as_an_object_are_accepted_like_a_json_string():
    (parsed,) = parse_batch(body(call(arguments={"a": 1, "b": 2})), max_batch_size=64)
    assert json.loads(parsed.arguments) == {"a": 1, "b": 2}


def test_missing_id_is_invalid_tool_call():
    raw = body({"type": "function", "function": {"name": "add", "arguments": "{}"}})
    assert rejection(raw).code is ErrorCode.INVALID_TOOL_CALL


@pytest.mark.parametrize("call_id", ["", "   "])
def test_empty_id_is_invalid_tool_call(call_id):
    error = rejection(body(call(call_id)))
    assert error.code is ErrorCode.INVALID_TOOL_CALL
    assert "tool_calls[0].id" in error.message


def test_overlong_id_is_invalid_tool_call():
    assert rejection(body(call("x" * (MAX_TOOL_CALL_ID_LENGTH + 1)))).code is ErrorCode.INVALID_TOOL_CALL


def test_id_of_the_wrong_type_is_invalid_tool_call():
    assert rejection(body(call(7))).code is ErrorCode.INVALID_TOOL_CALL


@pytest.mark.parametrize("type_", ["tool", "", None, "FUNCTION"])
def test_type_other_than_function_is_invalid_tool_call(type_):
    error = rejection(body(call(type_=type_)))
    assert error.code is ErrorCode.INVALID_TOOL_CALL
    assert "type" in error.message


@pytest.mark.parametrize("name", ["", "  ", None])
def test_empty_or_missing_name_is_invalid_tool_call(name):
    error = rejection(body(call(name=name)))
    assert error.code is ErrorCode.INVALID_TOOL_CALL
    assert "function.name" in error.message


def test_missing_function_is_invalid_tool_call():
    assert rejection(body({"id": "c1", "type": "function"})).code is ErrorCode.INVALID_TOOL_CALL


def test_missing_arguments_is_invalid_tool_call():
    raw = body({"id": "c1", "type": "function", "function": {"name": "add"}})
    error = rejection(raw)
    assert error.code is ErrorCode.INVALID_TOOL_CALL
    assert "arguments" in error.message


@pytest.mark.parametrize("arguments", [5, [1, 2], True])
def test_arguments_neither_string_nor_object_are_invalid_tool_call(arguments):
    assert rejection(body(call(arguments=arguments))).code is ErrorCode.INVALID_TOOL_CALL


def test_duplicate_ids_are_duplicate_tool_call_id():
    error = rejection(body(call("same"), call("other"), call("same")))
    assert error.code is ErrorCode.DUPLICATE_TOOL_CALL_ID
    assert "tool_calls[2]" in error.message


def test_an_empty_list_is_invalid_tool_call():
    assert rejection(body()).code is ErrorCode.INVALID_TOOL_CALL


def test_a_batch_over_the_size_limit_is_invalid_tool_call():
    raw = body(*(call(f"c{i}") for i in range(3)))
    assert rejection(raw, max_batch_size=2).code is ErrorCode.INVALID_TOOL_CALL


@pytest.mark.parametrize("raw", [b"", b"not json", b"{", b'{"tool_calls": [', b"\xff\xfe"])
def test_a_body_that_is_not_json_is_invalid_tool_call(raw):
    assert rejection(raw).code is ErrorCode.INVALID_TOOL_CALL


@pytest.mark.parametrize("raw", [b"[]", b"5", b'"tool_calls"', b"null", b"{}", b'{"tool_calls": {}}'])
def test_a_body_that_is_not_a_batch_object_is_invalid_tool_call(raw):
    assert rejection(raw).code is ErrorCode.INVALID_TOOL_CALL


def test_an_unknown_top_level_field_is_invalid_tool_call():
    raw = json.dumps({"tool_calls": [call()], "user_id": "bob"}).encode()
    assert rejection(raw).code is ErrorCode.INVALID_TOOL_CALL


def test_a_protocol_message_does_not_quote_the_arguments():
    secret = "sk-live-0123456789"
    raw = body(call(call_id="", arguments=json.dumps({"api_key": secret})))
    assert secret not in rejection(raw).message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
call_like = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values | st.text(max_size=4),
        "type": st.sampled_from(["function", "tool"]) | json_values,
        "function": st.fixed_dictionaries(
            {}, optional={"name": st.text(max_size=6) | json_values, "arguments": json_values | st.text(max_size=10)}
        )
        | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.fixed_dictionaries({"tool_calls": st.lists(call_like, max_size=5) | json_values})))
def test_protocol_checks_never_crash_on_arbitrary_json(value):
    raw = json.dumps(value).encode()
    try:
        parsed = parse_batch(raw, max_batch_size=64)
    except ProtocolError as exc:
        assert exc.code in (ErrorCode.INVALID_TOOL_CALL, ErrorCode.DUPLICATE_TOOL_CALL_ID)
    else:
        assert parsed and len({r.id for r in parsed}) == len(parsed)
        assert all(r.id.strip() and r.name.strip() for r in parsed)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_protocol_checks_never_crash_on_arbitrary_bytes(raw):
    try:
        parse_batch(raw, max_batch_size=64)
    except ProtocolError as exc:
        assert exc.code in (ErrorCode.INVALID_TOOL_CALL, ErrorCode.DUPLICATE_TOOL_CALL_ID)


@pytest.mark.parametrize("where", ["id", "name"])
def test_a_nul_character_in_an_id_or_a_name_is_invalid_tool_call(where):
    raw = body(call("c\x001")) if where == "id" else body(call(name="a\x00dd"))
    assert rejection(raw).code is ErrorCode.INVALID_TOOL_CALL


@pytest.mark.parametrize("where", ["id", "name"])
def test_a_lone_surrogate_in_an_id_or_a_name_is_invalid_tool_call(where):
    # A JSON body cannot carry one (the decoder refuses it); a model's call reaches the same check.
    function = FunctionCallIn(name="a\ud800dd" if where == "name" else "add", arguments="{}")
    tool_call = ToolCallIn(id="c\udc001" if where == "id" else "c1", type="function", function=function)
    with pytest.raises(ProtocolError) as caught:
        check_calls([tool_call], max_batch_size=64)
    assert caught.value.code is ErrorCode.INVALID_TOOL_CALL
    assert call_problem(tool_call, "tool_calls[0]") is not None
