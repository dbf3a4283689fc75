"""The rules for text and JSON from outside (gateway.text): depth, storable text, quoting,
and messages that name where a document broke and which field was wrong."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Literal

import jsonschema_rs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text import (
    INT64_MAX,
    decode_error_message,
    describe_validation_error,
    in_utc,
    is_storable,
    json_document_problem,
    nests_deeper_than,
    out_of_range_field,
    quoted,
    unstorable_json_text,
    refuse_line_breaks,
    visible,
)
from gateway.text import _JSON_STRING  # noqa: PLC2701 -- its linearity is the point



def nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    return (opener * depth + closer * depth).encode()


@pytest.mark.parametrize("depth", [1, 63, 64])
def test_a_document_at_most_max_depth_deep_passes(depth):
    assert not nests_deeper_than(nested(depth), 64)
    assert not nests_deeper_than(b'{"a":' * depth + b"1" + b"}" * depth, 64)


@pytest.mark.parametrize("depth", [65, 990, 5000])
def test_a_document_deeper_than_max_depth_is_caught_without_recursion(depth):
    assert nests_deeper_than(nested(depth), 64)
    assert nests_deeper_than(b'{"a":' * depth + b"1" + b"}" * depth, 64)


def test_brackets_inside_strings_do_not_count():
    document = json.dumps({"text": "[" * 500, "quote": 'a \\" [[[[ "' * 20, "list": [[1]]}).encode()
    assert not nests_deeper_than(document, 3)


@pytest.mark.parametrize(
    "document",
    [b'[' * 100 + b'"' + b'\\"' * 1000, b'[' * 100 + b'"abc\\', b'["a\\"b' * 200, b'"' * 3 + b'[' * 100],
    ids=["escaped-quotes-unterminated", "trailing-backslash", "escaped-quotes-repeated", "odd-quotes"],
)
def test_the_string_scan_matches_at_every_quote_so_it_never_rescans(document):
    """Linear by construction: a string that is never closed runs to the end of the document,
    so no quote starts an attempt that scans ahead and fails (which made the scan quadratic:
    a 1 MiB body of escaped quotes held the event loop for hours)."""
    for at in (i for i, byte in enumerate(document) if byte == ord('"')):
        assert _JSON_STRING.match(document, at) is not None, at


def test_an_unterminated_string_hides_the_brackets_after_it_but_not_those_before():
    assert nests_deeper_than(b"[" * 70 + b'"' + b"\\\"" * 10, 64)
    assert not nests_deeper_than(b'["' + b"[" * 70, 64)


def test_many_shallow_siblings_are_not_deep():
    assert not nests_deeper_than(json.dumps([[1], [2]] * 500).encode(), 2)
    assert nests_deeper_than(json.dumps([[[1]]] * 500).encode(), 2)


def _containers_of(inner: st.SearchStrategy) -> st.SearchStrategy:
    # A named function, not a lambda: Hypothesis reads a lambda's source to check that it
    # uses its argument, and a lambda spread over lines can make that check misfire.
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.integers() | st.text(max_size=4), _containers_of, max_leaves=20))
def test_the_scan_agrees_with_the_depth_of_any_document(value):
    def depth(node) -> int:
        if isinstance(node, list):
            return 1 + max((depth(item) for item in node), default=0)
        if isinstance(node, dict):
            return 1 + max((depth(item) for item in node.values()), default=0)
        return 0

    document = json.dumps(value).encode()
    actual = depth(value)
    assert not nests_deeper_than(document, max(actual, 1))
    if actual > 1:
        assert nests_deeper_than(document, actual - 1)


@pytest.mark.parametrize(
    "document",
    [b'{"a\\u0000": 1}', b'"x\\u0000"', b'"\\\\\\u0000"', b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\ud800"', b'"\\uDBFFx"'],
    ids=["nul-key", "nul-value", "nul-after-escaped-backslash", "lone-high", "lone-low", "two-highs", "upper-case"],
)
def test_escaped_nul_and_lone_surrogates_are_unstorable(document):
    assert unstorable_json_text(document) is not None


@pytest.mark.parametrize(
    "document",
    [b'"\\\\u0000"', b'"\\ud83d\\ude00"', b'"\\u00e9"', b'"plain"', b'"\\\\ud800"'],
    ids=["backslash-text", "surrogate-pair", "accent", "plain", "escaped-backslash-then-text"],
)
def test_text_postgresql_can_store_passes(document):
    assert unstorable_json_text(document) is None


def test_storable_python_text():
    assert is_storable("café 😀") and not is_storable("a\x00b") and not is_storable("\ud800")


def test_quoted_escapes_what_cannot_be_shown_and_cuts_long_text():
    assert quoted("a\x00b\ud800c\n") == "a\\u0000b\\ud800c\\u000a"
    assert quoted("k" * 100) == "k" * 64 + "…"
    quoted("\udfff" * 10).encode()  # always encodable


def test_bidirectional_controls_are_shown_as_escapes_and_other_text_is_left_alone():
    """A terminal or a page shows U+202E by reversing what follows: "\u202e00001" reads 10000."""
    assert quoted("\u202e00001 \u2066x\u2069 \u200b\ufeff") == "\\u202e00001 \\u2066x\\u2069 \\u200b\\ufeff"
    assert visible("👨\u200d👩 می\u200cخواهم \u200f") == "👨\u200d👩 می\u200cخواهم \u200f"
    assert visible("pay \u202e00001 to Zoë, 😀") == "pay \\u202e00001 to Zoë, 😀"
    assert visible("אבג abc") == "אבג abc"  # right-to-left letters are text, not controls


def test_a_document_problem_names_the_rule_it_breaks():
    assert "more than 64 levels" in json_document_problem(nested(65), max_depth=64)
    assert "NUL" in json_document_problem(b'{"a": "\\u0000"}', max_depth=64)
    assert "`a`" in json_document_problem(b'{"a": 1, "a": 2}', max_depth=64)
    assert json_document_problem(b'{"a": [1, {"b": 2}]}', max_depth=64) is None


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (b'{"a": 1,\n  "b": }', "it is not valid JSON: invalid character at line 2, column 8"),
        (b'{"a":', "it is not valid JSON: it ends too early at line 1, column 6"),
        (b"{}\n\n  x", "it is not valid JSON: trailing characters at line 3, column 4"),
        (b"  ", "it is empty"),
        (b'{"a": [1e400]}', "it holds a number too large for a 64-bit float"),
        (b'{"a": -1e400}', "it holds a number too large for a 64-bit float"),
    ],
)
def test_a_decode_error_names_the_line_and_column(document, expected):
    with pytest.raises(msgspec.DecodeError) as caught:
        msgspec.json.decode(document)
    assert decode_error_message(document, caught.value) == expected


def test_times_that_do_not_exist_in_utc_and_integers_beyond_64_bits_are_out_of_range():
    assert in_utc(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))) is None
    assert in_utc(datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-5)))) is None
    assert in_utc(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2026, 1, 1, tzinfo=UTC)
    assert out_of_range_field({"a": [1, {"b": INT64_MAX + 1}]}) == "a[1].b"
    assert out_of_range_field({"a": [1, {"b": INT64_MAX}]}) is None


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    mode: Literal["never", "always"] = "never"
    count: Annotated[int, msgspec.Meta(ge=1)] = 1


class Outer(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    inner: Inner | None = None
    items: list[Inner] = []


def described(document: bytes) -> str:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(document, type=Outer, strict=True)
    return describe_validation_error(caught.value, Outer, document)


def test_an_unknown_field_is_named_with_the_fields_expected_at_any_level():
    assert described(b'{"name": "n", "zz": 1}') == "`zz` is not a known field; expected only `name`, `inner`, `items`"
    assert described(b'{"name": "n", "items": [{"x\\u0001": 1}]}') == (
        "`items[0].x\\u0001` is not a known field; expected only `mode`, `count`"
    )


def test_a_missing_field_a_wrong_type_and_a_wrong_choice_are_named():
    assert described(b"{}") == "`name` is required"
    assert described(b'{"name": 5}') == "`name`: expected `str`, got `int`"
    assert described(b'{"name": "n", "inner": {"mode": "sometimes"}}') == '`inner.mode` must be one of "always", "never"'
    assert described(b"[1]") == "it must be a JSON object with the fields `name`, `inner`, `items` (`name` required), not array"


def test_malformed_json_is_described_as_such_even_when_a_field_fails_first():
    assert described(b'{"zz": 1, ') == "it is not valid JSON: it ends too early at line 1, column 11"


def test_text_rich_in_escaped_pairs_is_storable_and_a_lone_half_among_them_is_not():
    emoji = json.dumps({"text": "😀" * 5000}).encode()
    assert unstorable_json_text(emoji) is None
    assert unstorable_json_text(emoji[:-3] + b'\\udc00"}') is not None
    assert unstorable_json_text(b'"\\\\ud800\\udc00"') is not None  # text "\ud800", then a lone low half



def test_a_line_break_in_a_checked_field_is_refused_naming_the_field():
    refuse_line_breaks(name="ops", permissions=["a:b", "c:d"], roles=None)
    with pytest.raises(ValueError, match=r"`permissions\[1\]` must not hold a line break"):
        refuse_line_breaks(name="ops", permissions=["a:b", "c:d\n"])
    with pytest.raises(ValueError, match="`name`"):
        refuse_line_breaks(name="ops\n")


def test_dollar_alone_admits_a_final_line_break_in_python_which_is_why_the_check_exists():
    pattern = r"^[A-Za-z0-9_-]+$"
    assert re.search(pattern, "ops\n") is not None
    assert jsonschema_rs.validator_for({"type": "string", "pattern": pattern}).is_valid("ops\n") is False
