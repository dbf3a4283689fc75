"""The wire protocol of a tool-call batch and its checks.

A batch breaks the protocol when it is not a JSON object ``{"tool_calls": [...]}``, or a
call has a missing or empty id, a type other than ``function``, an empty name, or
arguments that are neither a JSON string nor an object, or two calls share an id, or
an object of the body gives one key twice, nests deeper than ``GATEWAY_MAX_JSON_DEPTH``,
holds text PostgreSQL cannot store (NUL, a lone surrogate) or a key the protocol does not
define, at any level (arguments sent as a JSON string are checked for all of that per call,
like any other argument error: ``gateway.execution.checks``). Any of these rejects the whole
batch before anything runs: the model cannot be answered call by call when the calls cannot
be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.errors import ErrorCode
from gateway.text import (
    DEFAULT_MAX_JSON_DEPTH,
    decode_error_message,
    describe_validation_error,
    is_storable,
    json_document_problem,
)

MAX_TOOL_CALL_ID_LENGTH = 128
MAX_TOOL_NAME_LENGTH = 128


class FunctionCallIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class ToolCallIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One entry of an assistant message's ``tool_calls``, exactly as the model produced it."""

    id: str | None = None
    type: str | None = None
    function: FunctionCallIn | None = None


class ToolCallBatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tool_calls: list[ToolCallIn]


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: bytes
    rejected: tuple[ErrorCode, str] | None = None
    """Set when the call broke the protocol (a model's call): it is answered with this code and
    message, not run. ``id`` and ``name`` are then storable stand-ins for what was sent."""


class ProtocolError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


_decoder = msgspec.json.Decoder(ToolCallBatch)


def malformed(problem: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_TOOL_CALL, f"Malformed tool-call batch: {problem}.")


def parse_batch(
    body: bytes, *, max_batch_size: int, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> list[ToolCallRequest]:
    problem = json_document_problem(body, max_depth=max_json_depth)
    if problem is not None:
        raise malformed(problem)
    try:
        batch = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise malformed(describe_validation_error(exc, ToolCallBatch, body)) from None
    except msgspec.DecodeError as exc:
        raise malformed(
            f'{decode_error_message(body, exc)}; the body must be a JSON object {{"tool_calls": [...]}}'
        ) from None
    return check_calls(batch.tool_calls, max_batch_size=max_batch_size)


def check_calls(calls: list[ToolCallIn], *, max_batch_size: int) -> list[ToolCallRequest]:
    if not calls:
        raise ProtocolError(ErrorCode.INVALID_TOOL_CALL, "tool_calls must not be empty.")
    if len(calls) > max_batch_size:
        raise ProtocolError(
            ErrorCode.INVALID_TOOL_CALL, f"A batch may hold at most {max_batch_size} tool calls."
        )
    seen: set[str] = set()
    checked: list[ToolCallRequest] = []
    for index, call in enumerate(calls):
        where = f"tool_calls[{index}]"
        problem = call_problem(call, where)
        if problem is not None:
            raise problem
        assert call.id is not None and call.function is not None and call.function.name is not None
        if call.id in seen:
            raise ProtocolError(
                ErrorCode.DUPLICATE_TOOL_CALL_ID, f"{where}.id repeats an earlier id of this batch."
            )
        seen.add(call.id)
        arguments = call.function.arguments
        raw = _argument_bytes(arguments)
        checked.append(ToolCallRequest(id=call.id, name=call.function.name, arguments=raw))
    return checked


def _argument_bytes(arguments: str | dict[str, Any]) -> bytes:
    # A lone surrogate (a model's text may hold one) cannot be encoded as UTF-8: pass it
    # through as invalid bytes, which the call's own argument decoding then refuses.
    if isinstance(arguments, str):
        return arguments.encode("utf-8", "surrogatepass")
    return msgspec.json.encode(arguments)


def call_problem(call: ToolCallIn, where: str) -> ProtocolError | None:
    """What is wrong with one call on its own (everything but a repeated id), or None."""
    problem = id_problem(call.id, where)
    if problem is not None:
        return problem
    if call.type != "function":
        return ProtocolError(ErrorCode.INVALID_TOOL_CALL, f"{where}.type must be \"function\".")
    function = call.function
    if function is None or function.name is None or not function.name.strip():
        return ProtocolError(ErrorCode.INVALID_TOOL_CALL, f"{where}.function.name is missing or empty.")
    if len(function.name) > MAX_TOOL_NAME_LENGTH:
        return ProtocolError(ErrorCode.INVALID_TOOL_CALL, f"{where}.function.name is too long.")
    if not is_storable(function.name):
        return ProtocolError(
            ErrorCode.INVALID_TOOL_CALL, f"{where}.function.name must not contain NUL characters or lone surrogates."
        )
    if function.arguments is None:
        return ProtocolError(ErrorCode.INVALID_TOOL_CALL, f"{where}.function.arguments is missing.")
    return None


def id_problem(call_id: str | None, where: str) -> ProtocolError | None:
    if call_id is None or not call_id.strip():
        return ProtocolError(ErrorCode.INVALID_TOOL_CALL, f"{where}.id is missing or empty.")
    if len(call_id) > MAX_TOOL_CALL_ID_LENGTH:
        return ProtocolError(
            ErrorCode.INVALID_TOOL_CALL, f"{where}.id is longer than {MAX_TOOL_CALL_ID_LENGTH} characters."
        )
    if not is_storable(call_id):
        return ProtocolError(
            ErrorCode.INVALID_TOOL_CALL, f"{where}.id must not contain NUL characters or lone surrogates."
        )
    return None
