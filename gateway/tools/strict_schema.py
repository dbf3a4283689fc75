"""The strictness rule for declared argument schemas: no field the schema does not name can
reach a service.

A schema is walked once, at start, against an allow-list of JSON Schema (2020-12) keywords;
a keyword outside it refuses the tool, so nothing the rule does not understand can widen what
is accepted. Every *instance location* (the top, each ``properties`` value, ``items``, each
``prefixItems`` entry, each ``$defs`` entry) must close every container it can accept:

- an object is closed by ``additionalProperties: false``, which is added to every node that
  declares an object (``type`` naming ``"object"``, or ``properties``) and leaves it out;
  any other ``additionalProperties``, ``patternProperties`` and ``unevaluatedProperties`` are
  refused;
- an array is closed by ``items`` (a schema, itself an instance location); ``prefixItems``
  alone leaves the rest of the array open;
- ``const``/``enum`` close what they list (the value is the declared one);
- in-place branches combine as their logic does: one closed ``allOf`` branch closes the node,
  ``anyOf``/``oneOf`` close it when every branch does (a branch only sees the types its
  parent allows), ``if`` closes it when both ``then`` and ``else`` do, and a ``$ref`` (``#``
  or ``#/$defs/NAME`` only) closes what its target closes in place (a chain of ``$ref`` targets
  that comes back to where it started closes nothing: validators accept anything there);
- ``not``, ``if`` and ``contains`` only narrow what their parent accepts: they are checked
  for keywords and names but never made strict (that would change their meaning).

A node that could accept an object or an array and closes neither is refused with its path.
Property names that name the caller's identity (``IDENTITY_FIELDS``, compared ignoring case,
``_`` and ``-``) are refused anywhere in the schema: identity comes only from the token.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema_rs

IDENTITY_FIELDS: tuple[str, ...] = (
    "sub",
    "user_id",
    "user",
    "tenant_id",
    "tenant",
    "role",
    "roles",
    "permissions",
    "author_id",
    "owner_id",
)
"""Argument names refused in any declared schema: they would let the model name who is calling."""

_IDENTITY = frozenset(re.sub(r"[^a-z0-9]", "", name) for name in IDENTITY_FIELDS)

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

# Keywords that only describe or constrain scalars/sizes: they can never widen what is accepted.
_PLAIN = frozenset({
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
    "format", "contentEncoding", "contentMediaType",
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired",
})
_STRUCTURE = frozenset({
    "properties", "additionalProperties", "items", "prefixItems", "allOf", "anyOf", "oneOf",
    "if", "then", "else", "not", "contains", "$ref",
})
_TOP_ONLY = frozenset({"$schema", "$defs", "definitions"})
_WHY_REFUSED = {
    "patternProperties": "patternProperties is not allowed (arguments are strict); name every field under properties",
    "unevaluatedProperties": "unevaluatedProperties is not allowed; use additionalProperties: false",
    "additionalItems": 'additionalItems is not allowed; use "prefixItems" and "items"',
    "dependentSchemas": "dependentSchemas is not allowed",
    "propertyNames": "propertyNames is not allowed; name every field under properties",
}
_CONTAINERS = frozenset({"object", "array"})
_KIND = {dict: "object", list: "array"}
_DEF_REF = re.compile(r"^#/(\$defs|definitions)/([A-Za-z0-9_.-]{1,128})$")


class SchemaError(ValueError):
    """A declared argument schema is not acceptable; the message says where and why."""


def is_identity_field(name: str) -> bool:
    return re.sub(r"[^a-z0-9]", "", name.lower()) in _IDENTITY


def strict_schema(schema: Any) -> dict[str, Any]:
    """A checked, strict copy of ``schema``: valid JSON Schema 2020-12, an object at the top,
    and no place in it that accepts a field it does not name (see the module's rule)."""
    if not isinstance(schema, dict):
        raise SchemaError("must be a JSON Schema object")
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        where = _dotted(exc.instance_path) or "(top level)"
        raise SchemaError(f"is not a valid JSON Schema at {where}: {_first_line(exc.message)}") from None
    except jsonschema_rs.ReferencingError:
        raise SchemaError("names a meta-schema ($schema) that is not a known JSON Schema draft") from None
    if schema.get("$schema", DRAFT_2020_12).rstrip("#") != DRAFT_2020_12:
        raise SchemaError(
            f"$schema must be {DRAFT_2020_12} (or left out): other drafts read $ref and items differently"
        )
    strict = copy.deepcopy(schema)
    if strict.get("type") != "object":
        raise SchemaError('must have "type": "object" at the top level (arguments are a JSON object)')
    _Walk(strict).check()
    strict.setdefault("properties", {})
    return strict


class _Walk:
    def __init__(self, root: dict[str, Any]) -> None:
        self._root = root
        self._defs = {**(root.get("definitions") or {}), **(root.get("$defs") or {})}
        self._ref_open: dict[str, frozenset[str]] = {}
        self._resolving: dict[str, int] = {}
        self._depth = 0

    def check(self) -> None:
        for keyword in ("$defs", "definitions"):
            for name, node in (self._root.get(keyword) or {}).items():
                self._location(node, f"/{keyword}/{name}")
        self._location(self._root, "")

    def _location(self, node: Any, where: str) -> None:
        """An instance location: it must close every container it can accept."""
        self._depth += 1
        try:
            open_kinds = self._node(node, where, _CONTAINERS, strict=True)
        finally:
            self._depth -= 1
        if "object" in open_kinds:
            raise SchemaError(
                f"{_at(where)}: could accept an object with any fields; declare its \"type\" and name its fields "
                "under \"properties\" (arguments are strict)"
            )
        if "array" in open_kinds:
            raise SchemaError(
                f"{_at(where)}: could accept an array of anything; declare its \"type\" and, for an array, "
                "\"items\" (arguments are strict)"
            )

    def _node(self, node: Any, where: str, allowed: frozenset[str], *, strict: bool) -> frozenset[str]:
        """The containers (of those ``allowed`` by the context) ``node`` accepts without closing them.

        ``strict``: the node is applied positively (it is hardened); ``False`` inside ``not``,
        ``if`` and ``contains``, which are only checked.
        """
        if node is True:
            return allowed
        if node is False:
            return frozenset()
        if not isinstance(node, dict):
            raise SchemaError(f"{_at(where)}: must be a schema (an object or a boolean)")
        for keyword in node:
            if keyword in _PLAIN or keyword in _STRUCTURE:
                continue
            if keyword in _TOP_ONLY and node is self._root:
                continue
            if keyword in _WHY_REFUSED:
                raise SchemaError(f"{_at(where)}: {_WHY_REFUSED[keyword]}")
            if keyword in _TOP_ONLY:
                raise SchemaError(f"{_at(where)}: {keyword} is only allowed at the top level")
            raise SchemaError(f"{_at(where)}: the keyword {keyword!r} is not supported in argument schemas")
        self._names(node, where)

        possible = allowed & _declared_kinds(node)
        if "additionalProperties" in node and node["additionalProperties"] is not False:
            raise SchemaError(
                f"{_at(where)}: additionalProperties must be false (arguments are strict); "
                "name every field under properties"
            )
        declares_object = "properties" in node or "object" in _types(node)
        if strict and declares_object:
            node["additionalProperties"] = False
        closed = set()
        if node.get("additionalProperties") is False:
            closed.add("object")
        if "items" in node:
            closed.add("array")
        if "const" in node or "enum" in node:
            closed |= _CONTAINERS
        open_kinds = possible - closed

        for name, child in (node.get("properties") or {}).items():
            self._child(child, f"{where}/properties/{name}", strict)
        if "items" in node:
            self._child(node["items"], f"{where}/items", strict)
        for index, child in enumerate(node.get("prefixItems") or ()):
            self._child(child, f"{where}/prefixItems/{index}", strict)
        for keyword in ("not", "if", "contains"):
            if keyword in node:
                self._node(node[keyword], f"{where}/{keyword}", _CONTAINERS, strict=False)

        if "$ref" in node:
            target = self._ref(node["$ref"], where)
            # The target applies in place: it closes what it closes, no more (a chain of
            # $refs that comes back to itself closes nothing; a validator accepts anything there).
            open_kinds = open_kinds & self._target_open(target) if strict else frozenset()
        for child_index, child in enumerate(node.get("allOf") or ()):
            open_kinds &= self._node(child, f"{where}/allOf/{child_index}", possible, strict=strict)
        for keyword in ("anyOf", "oneOf"):
            if keyword in node:
                branches = frozenset().union(*(
                    self._node(child, f"{where}/{keyword}/{index}", possible, strict=strict)
                    for index, child in enumerate(node[keyword])
                ))
                open_kinds &= branches
        conditional = []
        for keyword in ("then", "else"):
            if keyword in node:
                conditional.append(self._node(node[keyword], f"{where}/{keyword}", possible, strict=strict))
            else:
                conditional.append(possible)
        if "if" in node:
            open_kinds &= conditional[0] | conditional[1]
        return frozenset(open_kinds)

    def _child(self, child: Any, where: str, strict: bool) -> None:
        if strict:
            self._location(child, where)
        else:
            self._node(child, where, _CONTAINERS, strict=False)

    def _names(self, node: dict[str, Any], where: str) -> None:
        names = list(node.get("properties") or {}) + list(node.get("required") or ())
        for key, values in (node.get("dependentRequired") or {}).items():
            names += [key, *values]
        for name in names:
            if isinstance(name, str) and is_identity_field(name):
                raise SchemaError(
                    f"{_at(where)}: the field {name!r} names the caller's identity; identity comes only from "
                    "the verified token, never from arguments"
                )

    def _ref(self, ref: Any, where: str) -> str:
        """The checked ``$ref``'s target: ``""`` for the root, else ``/$defs/NAME`` (or ``/definitions/NAME``)."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"{_at(where)}: only local $ref (\"#/...\") is allowed, not {ref!r}")
        if ref == "#":
            return ""
        match = _DEF_REF.fullmatch(ref)
        if match is None or match.group(2) not in (self._root.get(match.group(1)) or {}):
            raise SchemaError(f"{_at(where)}: $ref must be \"#\" or name an entry of the top-level $defs, not {ref!r}")
        return f"/{match.group(1)}/{match.group(2)}"

    def _target_open(self, target: str) -> frozenset[str]:
        """The containers a ``$ref`` target accepts without closing them, at the referring node.

        A target met again while it is being resolved is a cycle: through a deeper instance
        location (a property, an item) it is recursion, and the target's own check decides;
        at the same location (``$ref`` to ``$ref``, or through ``allOf``/``anyOf``/...) it
        constrains nothing there, so it closes nothing.
        """
        if target in self._ref_open:
            return self._ref_open[target]
        started = self._resolving.get(target)
        if started is not None:
            return frozenset() if self._depth > started else _CONTAINERS
        if target:
            keyword, name = target[1:].split("/", 1)
            node = self._root[keyword][name]
        else:
            node = self._root
        self._resolving[target] = self._depth
        try:
            open_kinds = self._node(node, target, _CONTAINERS, strict=True)
        finally:
            del self._resolving[target]
        self._ref_open[target] = open_kinds
        return open_kinds


def _types(node: dict[str, Any]) -> list[Any]:
    types = node.get("type")
    if types is None:
        return []
    return types if isinstance(types, list) else [types]


def _declared_kinds(node: dict[str, Any]) -> frozenset[str]:
    kinds = set(_CONTAINERS)
    if "type" in node:
        kinds &= set(_types(node))
    if "const" in node:
        kinds &= {_KIND.get(type(node["const"]), "")}
    if "enum" in node:
        kinds &= {_KIND.get(type(value), "") for value in node["enum"]}
    return frozenset(kinds)


def _at(where: str) -> str:
    return where or "(top level)"


def _dotted(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "invalid"
