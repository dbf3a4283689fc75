"""Typed arguments: strict decoding, the JSON Schema the model sees, canonical form."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tools.base import ArgumentsInvalid, StructArguments, call_hash
from gateway.tools.builtin import (
    CreateArticleArgs,
    NoArguments,
    SearchArticlesArgs,
    TwoIntegers,
    UpdateArticleArgs,
    builtin_tools,
)

TWO = StructArguments(TwoIntegers)
SEARCH = StructArguments(SearchArticlesArgs)


def invalid(codec: StructArguments, raw: bytes) -> str:
    with pytest.raises(ArgumentsInvalid) as caught:
        codec.decode(raw)
    return caught.value.message


def test_valid_arguments_decode_into_the_typed_model():
    decoded = TWO.decode(b'{"a": 6, "b": 7}')
    assert decoded.value == TwoIntegers(a=6, b=7)
    assert msgspec.json.decode(decoded.canonical) == {"a": 6, "b": 7}


@pytest.mark.parametrize("raw", [b'{"a": "5", "b": 1}', b'{"a": 5.0, "b": 1}', b'{"a": true, "b": 1}'])
def test_no_type_coercion_and_the_field_is_named(raw):
    assert "`a`" in invalid(TWO, raw)


def test_a_missing_required_field_is_named():
    assert "`b`" in invalid(TWO, b'{"a": 1}')


@pytest.mark.parametrize("field", ["user_id", "tenant_id", "role", "roles", "sub"])
def test_identity_fields_are_unknown_fields_and_named(field):
    message = invalid(TWO, json.dumps({"a": 1, "b": 2, field: "carol"}).encode())
    assert f"`{field}`" in message
    assert "carol" not in message


@pytest.mark.parametrize("raw", [b"[1, 2]", b"5", b'"text"', b"null", b"{not json"])
def test_arguments_that_are_not_an_object_are_refused(raw):
    assert invalid(TWO, raw) == "Arguments must be a JSON object."


def test_empty_arguments_mean_no_arguments():
    assert StructArguments(NoArguments).decode(b"").canonical == b"{}"
    assert StructArguments(NoArguments).decode(b"  ").canonical == b"{}"


def test_constraints_are_enforced():
    assert "`limit`" in invalid(SEARCH, b'{"query": "x", "limit": 0}')
    assert "`query`" in invalid(SEARCH, b'{"query": ""}')


class Credentials(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    user: str
    password: Annotated[str, msgspec.Meta(min_length=8)]
    vault: Literal["main", "backup"] = "main"
    colour: Literal["red", "blue"] = "red"


CREDENTIALS = StructArguments(Credentials, frozenset({"password", "vault"}))


@pytest.mark.parametrize(
    "arguments",
    [
        {"user": "u", "password": "hunter2"},  # too short
        {"user": "u", "password": 12345678},  # wrong type
        {"user": "u", "password": "long-enough-secret", "vault": "hunter2-vault"},  # quoted by the enum check
    ],
)
def test_a_sensitive_field_value_is_never_echoed(arguments):
    message = invalid(CREDENTIALS, json.dumps(arguments).encode())
    for value in ("hunter2", "12345678", "hunter2-vault"):
        assert value not in message
    assert "`password`" in message or "`vault`" in message


def test_a_quoted_value_is_not_echoed_even_for_a_plain_field():
    message = invalid(CREDENTIALS, b'{"user": "u", "password": "long-enough", "colour": "s3cret-colour"}')
    assert "s3cret-colour" not in message
    assert "`colour`" in message


def test_a_struct_that_allows_unknown_fields_cannot_describe_arguments():
    class Loose(msgspec.Struct):
        a: int

    with pytest.raises(TypeError):
        StructArguments(Loose)


# --- the schema the model sees ---------------------------------------------------------


@pytest.mark.parametrize("tool", builtin_tools(), ids=lambda t: t.name)
def test_every_builtin_schema_forbids_additional_properties(tool):
    schema = tool.openai_definition()["function"]["parameters"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert "$defs" not in json.dumps(schema) and "$ref" not in json.dumps(schema)


@pytest.mark.parametrize("tool", builtin_tools(), ids=lambda t: t.name)
def test_every_builtin_schema_describes_each_of_its_fields(tool):
    schema = tool.openai_definition()["function"]["parameters"]
    struct = tool.arguments._struct  # type: ignore[attr-defined]
    assert set(schema["properties"]) == set(struct.__struct_fields__)
    assert set(schema["required"]) <= set(schema["properties"])


def test_a_field_named_title_is_described_in_the_schema():
    schema = StructArguments(CreateArticleArgs).json_schema()
    assert schema["properties"]["title"] == {
        "type": "string", "minLength": 1, "maxLength": 200, "description": "The article's title."
    }


def test_schema_lists_required_fields_and_types():
    schema = StructArguments(UpdateArticleArgs).json_schema()
    assert schema["required"] == ["article_id"]
    assert schema["properties"]["article_id"]["type"] == "string"
    assert schema["properties"]["article_id"]["pattern"] == "^[A-Za-z0-9_-]+$"
    assert set(schema["properties"]) == {"article_id", "title", "body"}


def test_schema_carries_defaults_and_bounds():
    schema = SEARCH.json_schema()
    assert schema["properties"]["limit"] == {
        "type": "integer", "minimum": 1, "maximum": 50, "default": 10, "description": "Most results to return."
    }


def test_schema_of_no_arguments_is_an_empty_closed_object():
    assert StructArguments(NoArguments).json_schema() == {
        "type": "object", "properties": {}, "required": [], "additionalProperties": False
    }


def test_schema_has_no_titles():
    assert "title" not in StructArguments(CreateArticleArgs).json_schema()


# --- canonical arguments: what repeats and approvals compare --------------------------


def test_key_order_does_not_change_the_canonical_form():
    assert TWO.decode(b'{"a": 1, "b": 2}').canonical == TWO.decode(b'{"b":2,"a":1}').canonical


def test_default_values_do_not_change_the_canonical_form():
    assert SEARCH.decode(b'{"query": "x"}').canonical == SEARCH.decode(b'{"limit": 10, "query": "x"}').canonical


def test_different_values_give_a_different_canonical_form():
    assert SEARCH.decode(b'{"query": "x"}').canonical != SEARCH.decode(b'{"query": "x", "limit": 11}').canonical


def test_call_hash_depends_on_the_tool_name():
    canonical = TWO.decode(b'{"a": 1, "b": 2}').canonical
    assert call_hash("add", canonical) != call_hash("multiply", canonical)


safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)


@settings(max_examples=200, deadline=None)
@given(a=safe_ints, b=safe_ints, reverse=st.booleans(), indent=st.sampled_from([None, 1, 4]))
def test_canonical_form_ignores_key_order_and_whitespace(a, b, reverse, indent):
    items = [("a", a), ("b", b)]
    if reverse:
        items.reverse()
    raw = json.dumps(dict(items), indent=indent).encode()
    assert TWO.decode(raw).canonical == json.dumps({"a": a, "b": b}, separators=(",", ":")).encode()


@settings(max_examples=200, deadline=None)
@given(query=st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=20), explicit_default=st.booleans(), reverse=st.booleans())
def test_canonical_form_fills_in_defaults(query, explicit_default, reverse):
    arguments = {"query": query, "limit": 10} if explicit_default else {"query": query}
    if reverse:
        arguments = dict(reversed(list(arguments.items())))
    assert SEARCH.decode(json.dumps(arguments).encode()).canonical == SEARCH.decode(
        json.dumps({"query": query}).encode()
    ).canonical


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_decoding_arbitrary_json_only_ever_refuses_with_a_safe_message(value):
    for codec in (TWO, SEARCH, CREDENTIALS):
        try:
            codec.decode(json.dumps(value).encode())
        except ArgumentsInvalid as exc:
            assert exc.message


def test_a_nul_character_in_a_value_is_refused_naming_the_field():
    message = invalid(SEARCH, json.dumps({"query": "a\x00b"}).encode())
    assert "`query`" in message and "NUL" in message


def test_the_text_backslash_u0000_is_an_ordinary_value():
    assert SEARCH.decode(json.dumps({"query": "a\\u0000b"}).encode()).value.query == "a\\u0000b"
