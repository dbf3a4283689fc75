"""A key given twice in one JSON object is refused, in arguments and in the batch around them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ErrorCode
from gateway.execution.guards.arguments import decode_arguments
from gateway.execution.protocol import ProtocolError, ToolCallRequest, parse_batch
from gateway.tools.base import ArgumentsInvalid, StructArguments
from gateway.tools.builtin import TwoIntegers
from gateway.tools.json_arguments import JsonSchemaArguments
from gateway.text import DEFAULT_MAX_JSON_DEPTH, json_document_problem
from gateway.tools.repeated_keys import repeated_key

TWO = StructArguments(TwoIntegers)
NESTED = JsonSchemaArguments({
    "type": "object",
    "properties": {"order": {"type": "object", "properties": {"id": {"type": "string"}, "note": {"type": "string"}}}},
})


def repeated_key_problem(document: bytes) -> str | None:
    return json_document_problem(document, max_depth=DEFAULT_MAX_JSON_DEPTH)


def refusal(codec: StructArguments | JsonSchemaArguments, raw: bytes) -> str:
    """What the per-call check says of ``raw`` as a call's arguments for a tool taking ``codec``."""
    tool = SimpleNamespace(arguments=codec)
    with pytest.raises(ArgumentsInvalid) as caught:
        decode_arguments(tool, ToolCallRequest(id="c1", name="t", arguments=raw), max_json_depth=DEFAULT_MAX_JSON_DEPTH)  # type: ignore[arg-type]
    return caught.value.message


def test_a_repeated_argument_is_refused_naming_it_whichever_value_would_win():
    assert refusal(TWO, b'{"a": 1, "b": 2, "a": 3}') == "the key `a` is given more than once in one object."
    assert "`a`" in refusal(TWO, b'{"a": 1, "a": 1, "b": 2}')


def test_a_repeated_key_in_a_nested_object_is_refused():
    assert "`id`" in refusal(NESTED, b'{"order": {"id": "o1", "note": "n", "id": "o2"}}')


def test_the_same_key_in_different_objects_is_fine():
    decoded = NESTED.decode(b'{"order": {"id": "o1", "note": "{\\"id\\": 1, \\"id\\": 2}"}}')
    assert decoded.value == {"order": {"id": "o1", "note": '{"id": 1, "id": 2}'}}


def test_a_long_repeated_key_is_named_cut_short():
    key = "k" * 500
    problem = repeated_key_problem(f'{{"{key}": 1, "{key}": 2}}'.encode())
    assert problem is not None and f"`{'k' * 64}…`" in problem and "k" * 65 not in problem


def test_a_repeated_key_is_quoted_escaped_whatever_it_holds():
    problem = repeated_key_problem(b'{"a\\u0001\\n": 1, "a\\u0001\\n": 2}')
    assert problem == "the key `a\\u0001\\u000a` is given more than once in one object"


def test_a_lone_surrogate_as_a_repeated_key_is_refused_as_text_that_cannot_be_stored():
    message = refusal(TWO, b'{"\\ud800": 1, "\\ud800": 2}')
    assert "lone UTF-16 surrogate" in message
    message.encode()  # the message itself can always be encoded


def test_nesting_too_deep_to_check_is_refused_not_crashed():
    deep = b'{"a":' * 1500 + b"1" + b"}" * 1500
    assert repeated_key_problem(deep) == "it nests arrays and objects more than 64 levels deep"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=6))
def test_a_document_json_can_write_has_no_repeated_key(value):
    assert repeated_key(json.dumps({"outer": value, "list": [value, value]}).encode()) is None


def batch(raw_call: str) -> bytes:
    return ('{"tool_calls": [' + raw_call + "]}").encode()


def protocol_error(raw: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_batch(raw, max_batch_size=8)
    return caught.value


def test_a_call_giving_its_id_twice_rejects_the_batch():
    error = protocol_error(batch('{"id": "c1", "id": "c2", "type": "function", "function": {"name": "add", "arguments": "{}"}}'))
    assert error.code is ErrorCode.INVALID_TOOL_CALL
    assert "`id` is given more than once" in error.message


def test_arguments_sent_as_an_object_with_a_repeated_key_reject_the_batch():
    error = protocol_error(batch(
        '{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2, "b": 5}}}'
    ))
    assert error.code is ErrorCode.INVALID_TOOL_CALL and "`b`" in error.message


def test_arguments_sent_as_a_string_are_left_to_the_per_call_check():
    (request,) = parse_batch(batch(
        '{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\\"a\\": 1, \\"a\\": 2}"}}'
    ), max_batch_size=8)
    assert request.arguments == b'{"a": 1, "a": 2}'
    assert "`a`" in refusal(TWO, request.arguments)


def test_text_that_is_not_json_is_left_to_the_decoder_to_describe():
    assert repeated_key_problem(b'{"a": 1, "b": nope}') is None
    assert refusal(TWO, b'{"a": 1, "b": nope}') == "Arguments must be a JSON object."
