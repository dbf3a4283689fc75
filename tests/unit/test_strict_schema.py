"""The strictness rule is total: whatever a declared schema says, a field it does not name
never gets through decoding, at any depth; a schema the rule cannot close is refused at
start, naming the place; identity-like names are refused anywhere."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema_rs
import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.tools.base import ArgumentsInvalid
from gateway.tools.json_arguments import JsonSchemaArguments
from gateway.tools.strict_schema import IDENTITY_FIELDS, SchemaError, is_identity_field, strict_schema

SMUGGLED = {"meta": {"user_id": "carol", "tenant_id": "globex", "roles": ["admin"]}}


def top(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (top(meta={}), "/properties/meta: could accept an object"),
        (top(meta=True), "/properties/meta: could accept an object"),
        (top(meta={"description": "anything"}), "/properties/meta: could accept an object"),
        (top(meta={"type": "array"}), "/properties/meta: could accept an array"),
        (top(meta={"type": "array", "items": True}), "/properties/meta/items: could accept an object"),
        (top(meta={"type": "array", "items": {}}), "/properties/meta/items: could accept an object"),
        (top(meta={"type": "array", "prefixItems": [{"type": "string"}]}), "/properties/meta: could accept an array"),
        (top(meta={"anyOf": [{}, {"type": "string"}]}), "/properties/meta: could accept an object"),
        (top(meta={"oneOf": [{"type": "string"}, {"minProperties": 1}]}), "/properties/meta: could accept an object"),
        (top(meta={"type": ["object", "string"], "properties": {"x": {"not": {"type": "string"}}}}),
         "/properties/meta/properties/x: could accept an object"),
        (top(meta={"if": {"type": "string"}, "then": {"type": "string"}}), "/properties/meta: could accept an object"),
        (top(meta={"type": "object", "additionalProperties": {"type": "string"}}),
         "/properties/meta: additionalProperties must be false"),
        (top(meta={"type": "object", "patternProperties": {"^x": {"type": "string"}}}),
         "/properties/meta: patternProperties is not allowed"),
        (top(meta={"type": "object", "unevaluatedProperties": False}), "unevaluatedProperties is not allowed"),
        (top(meta={"type": "object", "propertyNames": {"maxLength": 3}}), "propertyNames is not allowed"),
        (top(meta={"type": "object", "dependentSchemas": {"a": {}}}), "dependentSchemas is not allowed"),
        (top(meta={"type": "string", "nullable": True}), "the keyword 'nullable' is not supported"),
        (top(meta={"type": "object", "$defs": {"a": {"type": "string"}}}), "\\$defs is only allowed at the top level"),
        (top(meta={"$id": "https://x.example/m", "type": "string"}), "the keyword '\\$id' is not supported"),
        (top(meta={"$ref": "#/properties/other"}), "\\$ref must be"),
        (top(meta={"$ref": "#/$defs/missing"}), "\\$ref must be"),
        ({**top(meta={"$ref": "#/$defs/m"}), "$defs": {"m": {}}}, "/\\$defs/m: could accept an object"),
        ({**top(), "$schema": "http://json-schema.org/draft-07/schema#"}, "\\$schema must be"),
    ],
)
def test_a_schema_that_could_let_an_unnamed_field_through_is_refused_naming_the_place(schema: Any, where: str):
    with pytest.raises(SchemaError, match=where):
        strict_schema(schema)


@pytest.mark.parametrize(
    "schema",
    [
        top(meta={"type": "object", "properties": {"note": {"type": "string"}}}),
        top(meta={"type": ["object", "null"], "properties": {"note": {"type": "string"}}}),
        top(meta={"type": "array", "items": {"type": "object", "properties": {"note": {"type": "string"}}}}),
        top(meta={"type": "array", "prefixItems": [{"type": "object"}], "items": {"type": "object"}}),
        top(meta={"anyOf": [{"type": "object", "properties": {"note": {"type": "string"}}}, {"type": "string"}]}),
        top(meta={"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "integer"}}, {"type": "null"}]}),
        top(meta={"allOf": [{"type": "object", "properties": {"note": {"type": "string"}}}, {}]}),
        top(meta={"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "object"}, "type": "string"}),
        top(meta={"if": {"required": ["a"]}, "then": {"type": "object"}, "else": {"type": "array", "items": False}}),
        {**top(meta={"$ref": "#/$defs/m"}), "$defs": {"m": {"type": "object", "properties": {"note": {"type": "string"}}}}},
        {**top(meta={"$ref": "#/definitions/m"}), "definitions": {"m": {"type": "object"}}},
        top(meta={"$ref": "#"}),
        {**top(meta={"$ref": "#/$defs/node"}), "$defs": {"node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}},
        top(meta={"const": {"note": "fixed"}}),
        top(meta={"enum": [{"note": "a"}, ["b"]]}),
    ],
)
def test_the_smuggled_identity_never_gets_through_a_schema_the_rule_accepts(schema: dict[str, Any]):
    with pytest.raises(ArgumentsInvalid, match="`meta.user_id`|`meta`|Unknown field"):
        JsonSchemaArguments(schema).decode(msgspec.json.encode(SMUGGLED))


@pytest.mark.parametrize(
    "defs",
    [
        {"m": {"$ref": "#/$defs/m"}},
        {"m": {"$ref": "#/$defs/n"}, "n": {"$ref": "#/$defs/m"}},
        {"m": {"allOf": [{"$ref": "#/$defs/m"}]}},
        {"m": {"anyOf": [{"$ref": "#/$defs/m"}, {"type": "string"}]}},
    ],
    ids=["self", "two-step", "through-allOf", "through-anyOf"],
)
def test_a_ref_cycle_that_closes_nothing_in_place_is_refused(defs: dict[str, Any]):
    # A validator accepts anything where such a cycle applies: {"meta": {"user_id": ...}} would pass.
    with pytest.raises(SchemaError, match="/\\$defs/m: could accept an object"):
        strict_schema({**top(meta={"$ref": "#/$defs/m"}), "$defs": defs})


NOTE = {"type": "object", "properties": {"note": {"type": "string"}}}


@pytest.mark.parametrize(
    "meta",
    [
        {"type": "array", "prefixItems": [NOTE], "items": False},
        {"type": "array", "items": NOTE},
        {"if": {}, "then": {"type": "array", "items": NOTE}, "else": False},
    ],
)
def test_an_extra_key_in_an_object_inside_an_array_is_refused(meta: dict[str, Any]):
    codec = JsonSchemaArguments(top(meta=meta))
    codec.decode(msgspec.json.encode({"meta": [{"note": "x"}]}))
    with pytest.raises(ArgumentsInvalid, match="Unknown field `meta\\[0\\].user_id`"):
        codec.decode(msgspec.json.encode({"meta": [{"note": "x", "user_id": "carol"}]}))


def test_an_open_branch_is_fine_under_a_parent_that_closes_the_object():
    schema = strict_schema({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    })
    assert schema["additionalProperties"] is False
    assert "additionalProperties" not in schema["anyOf"][0]


def test_conditions_are_checked_but_never_made_strict():
    schema = strict_schema(top(a={"type": "object", "not": {"type": "object", "properties": {"x": {"type": "string"}}}}))
    assert "additionalProperties" not in schema["properties"]["a"]["not"]
    assert schema["properties"]["a"]["additionalProperties"] is False


@pytest.mark.parametrize("name", [*IDENTITY_FIELDS, "userId", "Tenant-ID", "ROLES", "ownerId"])
def test_identity_like_names_are_refused_anywhere_in_the_schema(name: str):
    assert is_identity_field(name)
    places = [
        top(**{name: {"type": "string"}}),
        top(meta={"type": "array", "items": {"type": "object", "properties": {name: {"type": "string"}}}}),
        {**top(m={"$ref": "#/$defs/m"}), "$defs": {"m": {"type": "object", "properties": {name: {"type": "string"}}}}},
        top(m={"type": "string", "not": {"type": "object", "properties": {name: {"type": "string"}}}}),
        {**top(), "required": [name]},
    ]
    for schema in places:
        with pytest.raises(SchemaError, match=f"the field '{name}' names the caller's identity"):
            strict_schema(schema)


@pytest.mark.parametrize("name", ["order_id", "username_hint", "subject", "user_note"])
def test_ordinary_names_that_merely_contain_an_identity_word_are_fine(name: str):
    assert not is_identity_field(name)
    strict_schema(top(**{name: {"type": "string"}}))


# --- property: whatever the loader accepts, an extra key at any depth is refused -------------

NAMES = ("a", "b", "c")
SCALARS = {
    "string": st.text(max_size=3),
    "integer": st.integers(-5, 5),
    "boolean": st.booleans(),
    "null": st.none(),
}
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(NAMES), inner, max_size=2),
    max_leaves=4,
)


@st.composite
def schema_and_witness(draw: Any, depth: int, ref: tuple[Any, Any, bool] | None) -> tuple[Any, Any, bool]:
    """A schema, a value for it, and whether that value is exact: accepted by the schema as
    written, so it must decode once hardened. An inexact value (under ``oneOf``, ``if``, ``not``)
    may be refused; the extra key must be refused either way.

    Every value is a tree of its own: the extra key is added in place, so no object in it may
    also sit elsewhere in the same value.
    """
    # Repeats weight the draw: an open leaf at an instance location gets the whole schema refused,
    # so it is kept rare enough that most schemas are accepted and nest objects to put the key in.
    kinds = ["scalar"] * 9 + ["open"] if depth == 0 else ["object"] * 3 + ["array"] * 2 + ["scalar"] * 2 + [
        "anyOf", "oneOf", "allOf", "if", "not", "open"
    ]
    if ref is not None:
        kinds.append("ref")
    kind = draw(st.sampled_from(kinds))
    if kind == "scalar":
        name = draw(st.sampled_from(sorted(SCALARS)))
        return {"type": name}, draw(SCALARS[name]), True
    if kind == "open":
        return draw(st.sampled_from([{}, True, {"description": "x"}, {"minProperties": 0}])), draw(ANY_JSON), True
    if kind == "ref":
        # the definition's value, as exact as the definition made it (it can be a ``not`` or an ``if``)
        return {"$ref": "#/$defs/d"}, copy.deepcopy(ref[1]), ref[2]  # type: ignore[index]
    child = schema_and_witness(depth - 1, ref)
    if kind == "object":
        children = draw(st.dictionaries(st.sampled_from(NAMES), child, max_size=3))
        present = draw(st.lists(st.sampled_from(sorted(children)), unique=True)) if children else []
        schema: dict[str, Any] = {"properties": {name: c[0] for name, c in children.items()}}
        object_type = draw(st.sampled_from(["object", ["object", "null"], None] * 2 + [["object", "array"]]))
        if object_type is not None:
            schema["type"] = object_type
        if draw(st.integers(0, 3)) == 0:  # already closed, as declared; mostly left to the rule to close
            schema["additionalProperties"] = False
        if present and draw(st.booleans()):
            schema["required"] = present[:1]
        exact = all(children[name][2] for name in present)
        return schema, {name: children[name][1] for name in present}, exact
    if kind == "array":
        schema = {"type": draw(st.sampled_from(["array", ["array", "null"]]))}
        prefix = draw(st.lists(child, max_size=2))
        if prefix:
            schema["prefixItems"] = [p[0] for p in prefix]
        rest: list[tuple[Any, Any, bool]] = []
        if draw(st.integers(0, 7)):  # mostly closed: without items the array is open and the schema refused
            item = draw(child)
            schema["items"] = item[0]
            rest = [(item[0], copy.deepcopy(item[1]), item[2]) for _ in range(draw(st.integers(0, 2)))]
        value = [p[1] for p in prefix] + [r[1] for r in rest] if prefix or rest else []
        return schema, value, all(p[2] for p in prefix) and all(r[2] for r in rest)
    if kind in ("anyOf", "oneOf"):
        branches = draw(st.lists(child, min_size=1, max_size=3))
        chosen = draw(st.sampled_from(branches))
        return {kind: [b[0] for b in branches]}, chosen[1], kind == "anyOf" and chosen[2]
    if kind == "allOf":
        inner = draw(child)
        other = draw(st.sampled_from([{}, True, {"required": []}, {"$comment": "x"}]))
        return {"allOf": [inner[0], other]}, inner[1], inner[2]
    if kind == "if":
        # a condition that always holds makes the value exactly as good as the ``then`` branch's
        always = draw(st.booleans())
        condition, then, otherwise = ({}, None, True) if always else draw(child), draw(child), draw(child)
        return {"if": condition[0], "then": then[0], "else": otherwise[0]}, then[1], always and then[2]
    # ``not: false`` refuses nothing, so the value is exactly as good as the outer schema's
    inner = (False, None, True) if draw(st.booleans()) else draw(child)
    outer = draw(child)
    schema = {**outer[0], "not": inner[0]} if isinstance(outer[0], dict) else {"not": inner[0]}
    return schema, outer[1], inner[0] is False and outer[2]


@st.composite
def declared_tool(draw: Any) -> tuple[dict[str, Any], dict[str, Any], bool]:
    definition = draw(schema_and_witness(1, None)) if draw(st.booleans()) else None
    children = draw(st.dictionaries(st.sampled_from(NAMES), schema_and_witness(3, definition), max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": {name: c[0] for name, c in children.items()}}
    if definition is not None:
        schema["$defs"] = {"d": definition[0]}
    value = {name: c[1] for name, c in children.items()}
    return schema, value, all(c[2] for c in children.values())


def objects_in(value: Any) -> list[dict[str, Any]]:
    found = [value] if isinstance(value, dict) else []
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        found += objects_in(child)
    return found


# Derandomized, with no example database: the same examples on every run and every machine.
@settings(
    max_examples=1000, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(tool=declared_tool(), data=st.data())
def test_an_extra_key_at_any_depth_never_gets_past_a_schema_the_loader_accepts(tool: Any, data: st.DataObject):
    schema, witness, exact = tool
    try:
        codec = JsonSchemaArguments(schema)
    except SchemaError:
        event("refused at start")
        return
    event("accepted")
    if exact:
        # the generator's own claim first, so a wrong claim is not mistaken for the gateway refusing valid arguments
        assert jsonschema_rs.validator_for(schema).is_valid(witness), "the generator's exact value is not valid"
        codec.decode(msgspec.json.encode(witness))  # the witness is fine: only the extra key is wrong
        event("exact value decoded")
    extra, extra_value = data.draw(st.sampled_from(["extra", "meta", "d"])), data.draw(ANY_JSON)
    for target in range(len(objects_in(witness))):  # every object in the value, at every depth, in turn
        smuggled = copy.deepcopy(witness)
        objects_in(smuggled)[target][extra] = extra_value
        with pytest.raises(ArgumentsInvalid):
            codec.decode(msgspec.json.encode(smuggled))
