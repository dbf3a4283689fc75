"""Arguments described by a declared JSON Schema (HTTP tools), validated with jsonschema-rs.

The schema is checked as a schema when the tool is declared, made strict (the rule is in
``gateway.tools.strict_schema``: no field it does not name can get through, at any depth, or
the tool is refused) and compiled once; validating a small object then costs well under a microsecond.

Error messages name the field and what was expected. They never quote the value the model
sent (jsonschema-rs's own messages do), so a secret in a sensitive field cannot be echoed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jsonschema_rs
import msgspec

from gateway.text import quoted
from gateway.tools.base import ArgumentsInvalid, DecodedArguments, decode_arguments
from gateway.tools.strict_schema import SchemaError, strict_schema

__all__ = ["JsonSchemaArguments", "SchemaError", "describe_error", "strict_schema"]

_decoder = msgspec.json.Decoder()


def _compile(schema: dict[str, Any]) -> Any:
    try:
        # offline: a schema must never make the gateway fetch anything.
        return jsonschema_rs.validator_for(schema, validate_formats=True, offline=True)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        raise SchemaError(f"cannot be compiled: {_first_line(str(exc))}") from None


class JsonSchemaArguments:
    """Strict decoding against a declared JSON Schema, as ``StructArguments`` does for Structs.

    ``value`` is the decoded object with the top-level defaults the schema declares filled in; ``canonical`` is its JSON with sorted keys. ``checks`` run after the
    schema passed and may refuse values the schema cannot express (``ArgumentsInvalid``).
    """

    def __init__(
        self,
        schema: Mapping[str, Any],
        sensitive: Iterable[str] = (),
        *,
        checks: Iterable[Callable[[dict[str, Any]], None]] = (),
    ) -> None:
        self._schema = strict_schema(dict(schema) if isinstance(schema, Mapping) else schema)
        self._validator = _compile(self._schema)
        properties: dict[str, Any] = self._schema["properties"]
        self._sensitive = frozenset(sensitive)
        unknown = sorted(self._sensitive - properties.keys())
        if unknown:
            raise SchemaError(f"sensitive field {unknown[0]!r} is not one of the schema's properties")
        self._defaults = {
            name: prop["default"] for name, prop in properties.items() if isinstance(prop, dict) and "default" in prop
        }
        self._check_defaults(properties)
        self._checks = tuple(checks)

    def json_schema(self) -> dict[str, Any]:
        return self._schema

    def decode(self, raw: bytes) -> DecodedArguments:
        return decode_arguments(raw, self._parse)

    def _parse(self, raw: bytes) -> dict[str, Any]:
        try:
            value = _decoder.decode(raw)
        except msgspec.DecodeError:
            raise ArgumentsInvalid("Arguments must be a JSON object.") from None
        if not isinstance(value, dict):
            raise ArgumentsInvalid("Arguments must be a JSON object.")
        if not self._validator.is_valid(value):
            raise ArgumentsInvalid(self._explain(value))
        if self._defaults:
            value = {**self._defaults, **value}
        for check in self._checks:
            check(value)
        return value

    def _explain(self, value: dict[str, Any]) -> str:
        for error in self._validator.iter_errors(value):
            return describe_error(error, self._sensitive)
        return "The arguments do not match the schema."

    def _check_defaults(self, properties: dict[str, Any]) -> None:
        defs = {k: self._schema[k] for k in ("$defs", "definitions") if k in self._schema}
        for name, default in self._defaults.items():
            if not _compile({**properties[name], **defs}).is_valid(default):
                raise SchemaError(f"the default of {name!r} does not match its own schema")


MAX_NAMED_FIELDS = 5
"""Most unknown fields one message names."""


def describe_error(error: Any, sensitive: frozenset[str] = frozenset()) -> str:
    """A message naming the field and the rule, never the offending value."""
    path = list(error.instance_path)
    kind = error.kind
    name = type(kind).__name__
    if name == "AdditionalProperties":
        # The model wrote these names: escaped (control characters, line breaks), cut, and
        # only the first few named.
        unexpected = list(kind.unexpected)
        prefix = _path(path) + ("." if path else "")
        fields = ", ".join(f"`{prefix}{quoted(str(field))}`" for field in unexpected[:MAX_NAMED_FIELDS])
        if len(unexpected) > MAX_NAMED_FIELDS:
            fields += f" and {len(unexpected) - MAX_NAMED_FIELDS} more"
        return f"Unknown field{'s' if len(unexpected) > 1 else ''} {fields}: only the schema's fields are accepted."
    if name == "Required":
        return f"`{_path([*path, str(kind.property)])}` is required."
    where = f"`{_path(path)}`" if path else "The arguments"
    if path and isinstance(path[0], str) and path[0] in sensitive:
        return f"Invalid value for {where}."
    rule = _RULES.get(name)
    return f"{where} {rule(kind)}." if rule is not None else f"Invalid value for {where}."


def _types(kind: Any) -> str:
    types = kind.types if isinstance(kind.types, list) else [kind.types]
    return " or ".join(str(t) for t in types)


def _options(kind: Any) -> str:
    return ", ".join(msgspec.json.encode(option).decode() for option in kind.options)[:300]


_RULES: dict[str, Callable[[Any], str]] = {
    "Type": lambda k: f"must be of type {_types(k)}",
    "Enum": lambda k: f"must be one of {_options(k)}",
    "Constant": lambda k: f"must be {msgspec.json.encode(k.expected_value).decode()[:100]}",
    "Minimum": lambda k: f"must be at least {k.limit}",
    "Maximum": lambda k: f"must be at most {k.limit}",
    "ExclusiveMinimum": lambda k: f"must be greater than {k.limit}",
    "ExclusiveMaximum": lambda k: f"must be less than {k.limit}",
    "MultipleOf": lambda k: f"must be a multiple of {k.multiple_of}",
    "MinLength": lambda k: f"must be at least {k.limit} characters long",
    "MaxLength": lambda k: f"must be at most {k.limit} characters long",
    "MinItems": lambda k: f"must have at least {k.limit} items",
    "MaxItems": lambda k: f"must have at most {k.limit} items",
    "UniqueItems": lambda k: "must not repeat items",
    "MinProperties": lambda k: f"must have at least {k.limit} fields",
    "MaxProperties": lambda k: f"must have at most {k.limit} fields",
    "Pattern": lambda k: f"must match the pattern {k.pattern}",
    "Format": lambda k: f"must be a valid {k.format}",
}


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "invalid"
