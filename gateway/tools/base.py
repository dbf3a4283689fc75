"""What a tool is: its contract with the model and with the gateway.

A tool declares its name, description, a typed argument model (a msgspec Struct that
forbids unknown fields, from which the JSON Schema the model sees is generated), whether
it mutates data, the permission it needs, its timeout, its maximum result size and which
argument fields are sensitive. The handler receives the caller's identity through
``ToolContext``, never through its arguments.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.auth.principal import Principal
from gateway.db.engine import Database

REDACTED = "[REDACTED]"


class ArgumentsInvalid(Exception):
    """The arguments do not match the schema; ``message`` is safe to show the model."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class DecodedArguments:
    value: Any
    """What the handler receives (a Struct for built-in tools)."""
    canonical: bytes
    """Canonical JSON (sorted keys, defaults filled in): what repeats and approvals compare."""


class ArgumentCodec(Protocol):
    """Turns the model's arguments into a value the handler accepts, strictly."""

    def json_schema(self) -> dict[str, Any]: ...

    def decode(self, raw: bytes) -> DecodedArguments: ...


class StructArguments:
    """Arguments described by a msgspec Struct: decoding is strict (no type coercion) and
    unknown fields are an error, so a model cannot smuggle in ``user_id`` or ``tenant_id``."""

    def __init__(self, struct: type[msgspec.Struct], sensitive: frozenset[str] = frozenset()) -> None:
        config = struct.__struct_config__
        if not config.forbid_unknown_fields:
            raise TypeError(f"{struct.__name__} must forbid unknown fields")
        self._struct = struct
        self._decoder = msgspec.json.Decoder(struct)
        self._sensitive = sensitive
        self._schema = inline_json_schema(msgspec.json.schema(struct))

    def json_schema(self) -> dict[str, Any]:
        return self._schema

    def decode(self, raw: bytes) -> DecodedArguments:
        return decode_arguments(raw, self._parse)

    def _parse(self, raw: bytes) -> Any:
        try:
            return self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise ArgumentsInvalid(_safe_validation_message(str(exc), self._sensitive)) from None
        except msgspec.DecodeError:
            raise ArgumentsInvalid("Arguments must be a JSON object.") from None


def decode_arguments(raw: bytes, parse: Callable[[bytes], Any]) -> DecodedArguments:
    """What every codec does around its own ``parse``: no arguments at all are an empty
    object, and the parsed value gets its canonical JSON (sorted keys), NUL refused. (The
    document rules, depth, storable text and keys given once, apply before: see
    ``gateway.execution.checks``.)"""
    value = parse(raw if raw.strip() else b"{}")
    canonical = msgspec.json.encode(value, order="sorted")
    refuse_nul(canonical)
    return DecodedArguments(value=value, canonical=canonical)


def refuse_nul(canonical: bytes) -> None:
    """No database text can hold NUL: refuse it, naming the field, before anything is stored."""
    if b"\\u0000" not in canonical:  # cheap pre-check; a literal backslash-u0000 text also matches
        return
    for name, field_value in msgspec.json.decode(canonical).items():
        if _holds_nul(field_value):
            raise ArgumentsInvalid(f"Invalid value for `{name}`: text must not contain NUL characters.")


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


def _safe_validation_message(message: str, sensitive: frozenset[str]) -> str:
    """msgspec's messages name the field and the expected type; they never quote the whole
    input, but a few (enum values) quote the offending value, which must not echo a secret."""
    field_path = message.rsplit(" - at `$.", 1)[1].rstrip("`") if " - at `$." in message else ""
    top_field = field_path.split(".", 1)[0].split("[", 1)[0]
    if top_field in sensitive or ("'" in message and top_field):
        return f"Invalid value for `{field_path}`."
    if message.startswith("Expected `object`"):
        return "Arguments must be a JSON object."
    return message.replace(" - at `$.", " at `").rstrip() + ("" if message.endswith(".") else ".")


def inline_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec puts structs under ``$defs``; models are given one self-contained object."""
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            resolved: dict[str, Any] = {}
            for key, value in node.items():
                if key == "title":  # the annotation keyword; a *property* named "title" stays
                    continue
                if key == "properties" and isinstance(value, dict):
                    resolved[key] = {name: resolve(schema) for name, schema in value.items()}
                else:
                    resolved[key] = resolve(value)
            return resolved
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    root = resolve({k: v for k, v in schema.items() if k != "$defs"})
    root.pop("description", None)
    root.setdefault("properties", {})
    root.setdefault("required", [])
    root["additionalProperties"] = False
    return root


@dataclass(slots=True)
class ToolContext:
    """Everything a handler may know about the call; identity comes only from here."""

    principal: Principal
    run_id: str
    tool_call_id: str
    request_id: str | None
    db: Database
    idempotency_key: str | None = None
    transaction: AsyncConnection | None = None
    """Set when the call runs inside the transaction that will also record its outcome."""
    timeout_s: float | None = None
    max_result_bytes: int | None = None
    """The limits this call runs under (the tool's, or the tenant's policy for it), set by
    the runner: a handler that enforces its own (an HTTP client's timeout, a capped read)
    reads them here, since a policy may raise them above the tool's declaration."""

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        if self.transaction is not None:
            yield self.transaction
            return
        async with self.db.connect() as conn:
            yield conn

    @asynccontextmanager
    async def write_transaction(self) -> AsyncIterator[AsyncConnection]:
        """The call's transaction when it has one, else a transaction of its own."""
        if self.transaction is not None:
            yield self.transaction
            return
        async with self.db.begin() as conn:
            yield conn


@dataclass(frozen=True, slots=True)
class PartialResult:
    """What a handler returns when it read a result only up to the size limit (an HTTP body
    cut off while streaming): it is shown truncated, with the original size when known."""

    kept: bytes
    original_bytes: int | None


Handler = Callable[[ToolContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    arguments: ArgumentCodec
    handler: Handler
    permission: str
    mutates: bool = False
    timeout_s: float | None = None
    max_result_bytes: int | None = None
    sensitive_fields: frozenset[str] = frozenset()
    local: bool = False
    """The handler does no I/O and has no effects (pure computation): it runs inline, without
    a timeout task, and a call of it that changes nothing (``pure``) runs before its admission."""
    remote: bool = False
    """The handler's effects live in another service (an HTTP tool), so none of them can join
    the gateway's transaction: a call that changes data runs with no transaction open and
    then records its outcome. Otherwise (the default) it runs inside the transaction that
    records its outcome, so its writes to the gateway's database and the record commit
    together or not at all."""

    @property
    def pure(self) -> bool:
        """A call of it may run before the ledger admits it: nothing happens but a computed
        outcome, which is stored in the admission statement, or dropped if the call is refused."""
        return self.local and not self.mutates

    def openai_definition(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.arguments.json_schema(),
            },
        }

    def redact(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        return {k: (REDACTED if k in self.sensitive_fields else v) for k, v in arguments.items()}

    def audit_arguments(self, decoded: DecodedArguments) -> Any:
        """What the audit keeps of the arguments: the canonical JSON, sensitive fields redacted."""
        if not self.sensitive_fields:
            return msgspec.Raw(decoded.canonical)
        return self.redact(msgspec.json.decode(decoded.canonical))


def call_hash(tool_name: str, canonical_arguments: bytes) -> str:
    """Identity of "the same call" for the repeat limit: tool name and canonical arguments."""
    return hashlib.sha256(tool_name.encode() + b"\x00" + canonical_arguments).hexdigest()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def struct_tool(
    *,
    name: str,
    description: str,
    arguments: type[msgspec.Struct],
    permission: str,
    mutates: bool = False,
    timeout_s: float | None = None,
    max_result_bytes: int | None = None,
    sensitive_fields: frozenset[str] = frozenset(),
    local: bool = False,
    remote: bool = False,
) -> Callable[[Handler], Tool]:
    """Declare a tool from a handler and its argument Struct."""

    def wrap(handler: Handler) -> Tool:
        return Tool(
            name=name,
            description=description,
            arguments=StructArguments(arguments, sensitive_fields),
            handler=handler,
            permission=permission,
            mutates=mutates,
            timeout_s=timeout_s,
            max_result_bytes=max_result_bytes,
            sensitive_fields=sensitive_fields,
            local=local,
            remote=remote,
        )

    return wrap
