"""Where every request's input is decoded: JSON bodies and query parameters.

Every route's ``data`` body is decoded here, once (``GatewayRequest.json``), under one rule:
the body nests at most ``GATEWAY_MAX_JSON_DEPTH`` deep, holds only storable text, gives each
key once, and decodes strictly into the route's type (no coercion, unknown fields refused at
every level). A body that breaks the rule is ``400 INVALID_REQUEST`` whose message names what
broke and where: the line and column of malformed JSON, the field and the fields expected.
The tool-call batch reads its body raw and applies the same rules in
``gateway.execution.protocol`` (``422 INVALID_TOOL_CALL``).

Query parameters hold only storable text (``check_request``, the app's ``before_request``:
Litestar runs only the innermost layer's hook, so a controller that sets one of its own must
call ``check_request`` first).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import msgspec
from litestar import Request
from litestar.params import QueryParameter
from litestar.types import Empty

from gateway.errors import ErrorCode, GatewayError
from gateway.text import (
    DEFAULT_MAX_JSON_DEPTH,
    decode_error_message,
    describe_validation_error,
    expected_shape,
    json_document_problem,
    out_of_range_field,
    quoted,
    unstorable_text_problem,
)

Decoders = dict[Any, msgspec.json.Decoder[Any]]
"""Strict decoders by target type, made on first use: one app's, kept by its request class."""


def _decoder_for(target: Any, decoders: Decoders) -> msgspec.json.Decoder[Any]:
    decoder = decoders.get(target)
    if decoder is None:
        decoder = decoders[target] = msgspec.json.Decoder(target, strict=True)
    return decoder


def invalid_body(problem: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, f"Invalid request body: {problem}.")


def decode_body(body: bytes, target: Any, *, max_depth: int, decoders: Decoders) -> Any:
    """``body`` decoded into ``target`` under the rule above, or ``GatewayError`` (400)."""
    problem = json_document_problem(body, max_depth=max_depth)
    if problem is not None:
        raise invalid_body(problem)
    try:
        value = _decoder_for(target, decoders).decode(body)
    except msgspec.ValidationError as exc:
        raise invalid_body(describe_validation_error(exc, target, body)) from None
    except msgspec.DecodeError as exc:
        raise invalid_body(decode_error_message(body, exc)) from None
    where = out_of_range_field(value)
    if where is not None:
        raise invalid_body(f"`{quoted(where)}` is out of range")
    return value


def body_type(request: Request[Any, Any, Any]) -> Any:
    """The type the route declares for its ``data`` body (``Any`` when it declares none)."""
    field = request.route_handler.parsed_data_field
    return Any if field is None else field.annotation


class GatewayRequest(Request[Any, Any, Any]):
    """Litestar's request, decoding JSON bodies under the gateway's rule (``decode_body``).
    An app uses its own subclass, made by ``request_class``."""

    max_json_depth: ClassVar[int] = DEFAULT_MAX_JSON_DEPTH
    decoders: ClassVar[Decoders]

    async def json(self) -> Any:
        if self._json is Empty:
            cached = self._connection_state.json
            if cached is not Empty:
                self._json = cached
            else:
                body = await self.body()
                self._json = self._connection_state.json = decode_body(
                    body or b"null", body_type(self), max_depth=self.max_json_depth, decoders=self.decoders
                )
        return self._json


def request_class(*, max_json_depth: int) -> type[GatewayRequest]:
    """The request class of one app: ``GatewayRequest`` under that app's nesting bound, with
    that app's decoders."""
    return type("GatewayRequest", (GatewayRequest,), {"max_json_depth": max_json_depth, "decoders": {}})


async def check_request(request: Request[Any, Any, Any]) -> None:
    """Before any handler: query parameters hold storable text, and a route that needs a body
    gets one (Litestar would otherwise say only that ``data`` is missing)."""
    seen: set[str] = set()
    integers = _integer_parameters(request.route_handler)
    for name, value in request.query_params.multi_items():
        problem = unstorable_text_problem(name) or unstorable_text_problem(value)
        if problem is not None:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"Invalid query parameter `{quoted(name)}`: {problem}.")
        if name in seen:
            # As for a body's repeated key: which one counts would be a guess.
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"Query parameter `{quoted(name)}` is given more than once.")
        seen.add(name)
        if name in integers and _DECIMAL.fullmatch(value) is None:
            # Not coerced: `limit=1.0` or `limit=1e2` is a client's mistake, not 1 or 100.
            raise GatewayError(
                ErrorCode.INVALID_REQUEST, f"Query parameter `{quoted(name)}` must be an integer in decimal digits."
            )
    field = request.route_handler.parsed_data_field
    if field is not None and not field.is_optional and not await request.body():
        raise invalid_body(f"it is empty; expected {expected_shape(field.annotation)}")


_DECIMAL = re.compile(r"-?[0-9]{1,18}")
_INTEGER_PARAMETERS: dict[object, frozenset[str]] = {}


def _integer_parameters(handler: Any) -> frozenset[str]:
    """The query parameters of a route typed as integers (read once per route)."""
    names = _INTEGER_PARAMETERS.get(handler)
    if names is None:
        names = frozenset(
            # The key the query spells: an alias (`name`, formerly `query`) if it has one.
            field.kwarg_definition.name or field.kwarg_definition.query or name
            for name, field in handler.parsed_fn_signature.parameters.items()
            if isinstance(field.kwarg_definition, QueryParameter) and field.is_subclass_of(int)
            and not field.is_subclass_of(bool)
        )
        _INTEGER_PARAMETERS[handler] = names
    return names
