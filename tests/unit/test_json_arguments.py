"""Declared JSON Schemas: strict at every depth, checked at start, errors that name the field
and never echo a value."""

from __future__ import annotations

import json

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode
from gateway.execution.checks import plan_call
from gateway.execution.protocol import ToolCallRequest
from gateway.tools.base import ArgumentCodec, ArgumentsInvalid, Tool
from gateway.tools.json_arguments import JsonSchemaArguments, SchemaError
from gateway.tools.registry import ToolRegistry

ORDER = {
    "type": "object",
    "required": ["order_id", "lines"],
    "properties": {
        "order_id": {"type": "string", "maxLength": 12},
        "pin": {"type": "string", "pattern": "^[0-9]{4}$"},
        "priority": {"type": "string", "enum": ["low", "high"], "default": "low"},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["sku"],
                "properties": {"sku": {"type": "string"}, "gift": {"$ref": "#/$defs/gift"}},
            },
        },
        "contact": {"anyOf": [{"type": "object", "properties": {"email": {"type": "string"}}}, {"type": "null"}]},
    },
    "$defs": {"gift": {"type": "object", "properties": {"note": {"type": "string"}}}},
}


def codec(schema: dict[str, Any] = ORDER, sensitive: tuple[str, ...] = ("pin",)) -> JsonSchemaArguments:
    return JsonSchemaArguments(schema, sensitive)


def objects(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append(node)
        for value in node.values():
            found += objects(value)
    elif isinstance(node, list):
        for value in node:
            found += objects(value)
    return found


def test_codec_plugs_into_the_executor_checks_and_audit_redaction():
    async def handler(ctx: Any, arguments: Any) -> Any:
        return arguments

    arguments: ArgumentCodec = codec()
    tool = Tool(name="place_order", description="d", arguments=arguments, handler=handler, permission="orders:write",
                sensitive_fields=frozenset({"pin"}))
    principal = Principal(tenant_id="acme", user_id="bob", roles=frozenset({"editor"}),
                          permissions=frozenset({"orders:write"}))
    registry = ToolRegistry([tool])

    plan = plan_call(registry, principal, ToolCallRequest(
        id="c1", name="place_order", arguments=b'{"order_id": "o1", "lines": [], "pin": "1234"}'))
    assert plan.rejected is None
    assert plan.arguments is not None and plan.arguments.value["priority"] == "low"
    assert plan.audit_arguments == {"lines": [], "order_id": "o1", "pin": "[REDACTED]", "priority": "low"}
    assert registry.definitions_json(principal.permissions).count(b'"additionalProperties":false') == 4

    refused = plan_call(registry, principal, ToolCallRequest(
        id="c2", name="place_order", arguments=b'{"order_id": "o1", "lines": [], "user_id": "carol"}'))
    assert refused.rejected is ErrorCode.INVALID_ARGUMENTS
    assert "user_id" in (refused.rejection_content or "")


def test_every_object_is_made_strict_even_when_the_file_forgets_it():
    schema = codec().json_schema()
    found = objects(schema)
    assert len(found) == 4  # top, a line, the gift, the contact
    assert all(node["additionalProperties"] is False for node in found)
    assert "additionalProperties" not in ORDER  # the declaration itself is left alone


@pytest.mark.parametrize(
    "arguments",
    [
        b'{"order_id": "o1", "lines": [], "tenant_id": "globex"}',
        b'{"order_id": "o1", "lines": [{"sku": "a", "user_id": "carol"}]}',
        b'{"order_id": "o1", "lines": [{"sku": "a", "gift": {"note": "hi", "role": "admin"}}]}',
        b'{"order_id": "o1", "lines": [], "contact": {"email": "a@b.c", "roles": ["admin"]}}',
    ],
)
def test_unknown_fields_are_refused_at_any_depth(arguments: bytes):
    with pytest.raises(ArgumentsInvalid):
        codec().decode(arguments)


def test_unknown_field_error_names_its_path():
    with pytest.raises(ArgumentsInvalid) as error:
        codec().decode(b'{"order_id": "o1", "lines": [{"sku": "a", "user_id": "carol"}]}')
    assert "`lines[0].user_id`" in error.value.message


def test_unknown_field_names_are_quoted_escaped_and_cut():
    name = "evil\u001b[2J\nnext line\u2028" + "k" * 100
    with pytest.raises(ArgumentsInvalid) as error:
        codec().decode(json.dumps({"order_id": "o1", "lines": [{"sku": "a", name: 1}]}).encode())
    message = error.value.message
    assert "`lines[0].evil\\u001b[2J\\u000anext line\\u2028kk" in message
    assert not any(ch in message for ch in "\x1b\n\u2028")
    assert "k" * 60 not in message and "…" in message


def test_a_message_names_only_the_first_few_unknown_fields():
    arguments = {"order_id": "o1", "lines": [], **{f"extra_{i}": i for i in range(1000)}}
    with pytest.raises(ArgumentsInvalid) as error:
        codec().decode(json.dumps(arguments).encode())
    message = error.value.message
    assert message.count("`extra_") == 5 and "and 995 more" in message
    assert len(message) < 400


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (b'{"lines": []}', "`order_id` is required."),
        (b'{"order_id": 7, "lines": []}', "`order_id` must be of type string."),
        (b'{"order_id": "o1234567890123", "lines": []}', "`order_id` must be at most 12 characters long."),
        (b'{"order_id": "o1", "lines": [], "priority": "urgent"}', '`priority` must be one of "low", "high".'),
        (b'{"order_id": "o1", "lines": [{}]}', "`lines[0].sku` is required."),
        (b"[1, 2]", "Arguments must be a JSON object."),
        (b'{"order_id": ', "Arguments must be a JSON object."),
    ],
)
def test_errors_name_the_field_and_the_rule(arguments: bytes, expected: str):
    with pytest.raises(ArgumentsInvalid) as error:
        codec().decode(arguments)
    assert error.value.message == expected


@pytest.mark.parametrize("pin", ["secret-pin-1234", "12345", "abcd"])
def test_values_of_sensitive_fields_are_never_echoed(pin: str):
    with pytest.raises(ArgumentsInvalid) as error:
        codec().decode(b'{"order_id": "o1", "lines": [], "pin": "%s"}' % pin.encode())
    assert error.value.message == "Invalid value for `pin`."


@settings(max_examples=200, deadline=None)
@given(value=st.text(min_size=6))
def test_no_error_message_quotes_the_value_sent(value: str):
    for field in ("order_id", "priority"):
        raw = msgspec.json.encode({"order_id": "o1", "lines": [], field: value})
        try:
            codec().decode(raw)
        except ArgumentsInvalid as error:
            assert value not in error.message


def test_canonical_form_ignores_key_order_and_fills_defaults():
    a = codec().decode(b'{"lines": [{"sku": "a"}], "order_id": "o1"}')
    b = codec().decode(b'{"order_id": "o1", "priority": "low", "lines": [{"sku": "a"}]}')
    assert a.canonical == b.canonical == b'{"lines":[{"sku":"a"}],"order_id":"o1","priority":"low"}'


def test_canonical_form_decodes_again_to_the_same_value():
    """Approvals re-decode the stored canonical arguments before executing them."""
    first = codec().decode(b'{"order_id": "o1", "lines": [{"sku": "a", "gift": {"note": "x"}}]}')
    assert codec().decode(first.canonical) == first


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "array"}, '"type": "object"'),
        ({"type": "object", "properties": {"a": {"type": "strnig"}}}, "not a valid JSON Schema at properties.a.type"),
        ({"type": "object", "additionalProperties": True}, "additionalProperties must be false"),
        ({"type": "object", "properties": {"a": {"type": "object", "additionalProperties": {"type": "string"}}}},
         "/properties/a: additionalProperties must be false"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties is not allowed"),
        ({"type": "object", "properties": {"a": {"$ref": "https://schemas.example/a.json"}}}, "only local \\$ref"),
        ({"type": "object", "properties": {"a": {"type": "integer", "default": "one"}}}, "default of 'a'"),
        ([], "must be a JSON Schema object"),
    ],
)
def test_unacceptable_schemas_are_refused_at_start(schema: Any, why: str):
    with pytest.raises(SchemaError, match=why):
        JsonSchemaArguments(schema)


def test_sensitive_fields_must_be_declared_properties():
    with pytest.raises(SchemaError, match="'password'"):
        JsonSchemaArguments(ORDER, ["password"])


def test_checks_run_after_the_schema():
    def no_drafts(arguments: dict[str, Any]) -> None:
        if arguments["order_id"].startswith("draft"):
            raise ArgumentsInvalid("`order_id` must not be a draft.")

    checked = JsonSchemaArguments(ORDER, checks=[no_drafts])
    with pytest.raises(ArgumentsInvalid, match="draft"):
        checked.decode(b'{"order_id": "draft1", "lines": []}')
    with pytest.raises(ArgumentsInvalid, match="required"):
        checked.decode(b"{}")  # the schema speaks first
