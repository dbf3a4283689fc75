"""OpenAPI helpers: documented error responses, request bodies a handler decodes itself, and
the pass that makes the generated document as strict as the server.

The tool-calls route reads its raw body so that a malformed batch is still audited and
answered ``422 INVALID_TOOL_CALL``; ``raw_json_body`` keeps its request schema in the
OpenAPI document all the same.

Litestar's generator drops what msgspec enforces (``forbid_unknown_fields``, ``gt``), marks
a body with a default as required and cannot say a route needs no token; ``tighten`` fixes
the document where the server is the authority, once, before it is first served.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)

from gateway.api.schemas import ErrorEnvelope, Input
from gateway.auth.middleware import PUBLIC_PATHS
from gateway.tools.base import inline_json_schema

ERROR_DESCRIPTIONS = {
    400: "Invalid request (INVALID_REQUEST, CLIENT_TOOLS_NOT_ALLOWED)",
    401: "Missing or invalid bearer token (UNAUTHENTICATED)",
    403: "Not permitted (FORBIDDEN, TENANT_DISABLED, SELF_APPROVAL_FORBIDDEN)",
    404: "Not found in the caller's tenant (NOT_FOUND)",
    409: "Conflict (ALREADY_DECIDED, APPROVAL_EXPIRED, RUN_NOT_RESUMABLE, CONFLICT)",
    413: "Body too large (PAYLOAD_TOO_LARGE)",
    422: "Protocol error: nothing ran (INVALID_TOOL_CALL, DUPLICATE_TOOL_CALL_ID)",
    429: "Over the tenant's or user's rate limit (RATE_LIMITED); see Retry-After",
    502: "The model provider failed (UPSTREAM_UNAVAILABLE, UPSTREAM_BAD_RESPONSE, UPSTREAM_REJECTED)",
    503: "Database unavailable (SERVICE_UNAVAILABLE) or no model provider (MODEL_NOT_CONFIGURED)",
    504: "The model provider did not answer in time (UPSTREAM_TIMEOUT)",
}

TOOL_CALLS_PATH = "/v1/runs/{run_id}/tool-calls"
STREAMED = {
    ("/v1/chat/completions", "post"): "With `stream: true`: server-sent events, one `chat.completion.chunk` per "
    "`data:` line, ending with `data: [DONE]`.",
    ("/v1/runs/{run_id}/resume", "post"): "With `stream: true`: server-sent events, as for chat completions.",
}
"""Operations that answer ``text/event-stream`` instead of JSON when the body asks for a stream."""


def raw_json_body(struct: type[msgspec.Struct], description: str) -> type[Operation]:
    schema = inline_json_schema(msgspec.json.schema(struct))

    @dataclass
    class OperationWithBody(Operation):
        def __post_init__(self) -> None:
            self.request_body = RequestBody(
                required=True,
                description=description,
                content={"application/json": OpenAPIMediaType(schema=schema)},  # type: ignore[arg-type]
            )

    return OperationWithBody


def streamed_text_response(media_types: dict[str, str], description: str) -> type[Operation]:
    """A 200 whose body is streamed text in one of ``media_types`` (type → what it holds)."""

    @dataclass
    class OperationWithStream(Operation):
        def __post_init__(self) -> None:
            content = {
                media: OpenAPIMediaType(schema=Schema(type=OpenAPIType.STRING, description=what))
                for media, what in media_types.items()
            }
            responses = dict(self.responses or {})
            responses["200"] = OpenAPIResponse(description=description, content=content)
            self.responses = responses

    return OperationWithStream


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    if 401 in statuses and 429 not in statuses:
        statuses = (*statuses, 429)  # every authenticated route is rate limited when limits are on
    return {
        status: ResponseSpec(
            data_container=ErrorEnvelope, description=ERROR_DESCRIPTIONS[status], generate_examples=False
        )
        for status in statuses
    }


# -- the document says what the server enforces ------------------------------------------------

_COMPONENT_REF = "#/components/schemas/{name}"
_OPERATION_METHODS = ("get", "head", "post", "put", "patch", "delete")


LINKS: dict[tuple[str, str, str], list[tuple[str, str, str, str]]] = {
    # (path, method, status): [(target path, target method, its path parameter, where the value is)]
    ("/v1/runs", "post", "201"): [
        ("/v1/runs/{run_id}", "get", "run_id", "$response.body#/id"),
        ("/v1/runs/{run_id}/tool-calls", "post", "run_id", "$response.body#/id"),
        ("/v1/runs/{run_id}/resume", "post", "run_id", "$response.body#/id"),
    ],
    ("/v1/chat/completions", "post", "200"): [
        ("/v1/runs/{run_id}", "get", "run_id", "$response.body#/gateway/run_id"),
        ("/v1/runs/{run_id}/resume", "post", "run_id", "$response.body#/gateway/run_id"),
    ],
    ("/v1/admin/roles", "post", "201"): [
        ("/v1/admin/roles/{name}", "get", "name", "$response.body#/name"),
        ("/v1/admin/roles/{name}", "put", "name", "$response.body#/name"),
        ("/v1/admin/roles/{name}", "delete", "name", "$response.body#/name"),
    ],
    ("/v1/admin/tools", "get", "200"): [
        ("/v1/admin/tools/{tool}", "get", "tool", "$response.body#/items/0/tool"),
        ("/v1/admin/tools/{tool}", "put", "tool", "$response.body#/items/0/tool"),
    ],
    ("/v1/admin/tools/{tool}", "put", "200"): [
        ("/v1/admin/tools/{tool}", "get", "tool", "$response.body#/tool"),
        ("/v1/admin/tools/{tool}", "delete", "tool", "$response.body#/tool"),
    ],
    ("/v1/admin/approvals", "get", "200"): [
        ("/v1/approvals/{approval_id}", "get", "approval_id", "$response.body#/items/0/id"),
        ("/v1/admin/approvals/{approval_id}/approve", "post", "approval_id", "$response.body#/items/0/id"),
        ("/v1/admin/approvals/{approval_id}/reject", "post", "approval_id", "$response.body#/items/0/id"),
    ],
}
"""OpenAPI links: where an answer's ids lead (clients and stateful testers follow them)."""


def add_links(paths: dict[str, Any]) -> None:
    for (path, method, status), targets in LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is None:
            continue
        links = response.setdefault("links", {})
        for target_path, target_method, parameter, value in targets:
            target = paths.get(target_path, {}).get(target_method)
            if target is None or "operationId" not in target:
                continue
            links[target["operationId"]] = {"operationId": target["operationId"], "parameters": {parameter: value}}


NO_NUL = r"^[^\x00]*$"
"""No NUL in a string (PostgreSQL's text and jsonb cannot hold it; the server refuses it
anywhere in a body or a query, ``gateway.text``). Lone surrogates are refused too, but a
pattern cannot say so portably: JSON Schema patterns match UTF-16 code units in some
engines, where a surrogate range would also refuse every character outside the BMP."""

STORABLE_JSON = "StorableJson"
_STORABLE_REF = {"$ref": _COMPONENT_REF.format(name=STORABLE_JSON)}
STORABLE_JSON_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value whose strings and keys hold no NUL (PostgreSQL cannot store it).",
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": _STORABLE_REF},
        {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": _STORABLE_REF},
    ],
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples"})


def storable(schema: Any) -> Any:
    """``schema`` with the server's storable-text rule written in: a pattern on every free
    string, NUL-free keys on every object, and ``StorableJson`` wherever any value goes."""
    if isinstance(schema, list):
        return [storable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return schema
    if not (set(schema) - _ANNOTATIONS):  # {} : any JSON value
        return {**schema, **_STORABLE_REF}
    out = {key: storable(value) for key, value in schema.items() if key != "properties"}
    if "properties" in schema:
        out["properties"] = {name: storable(value) for name, value in schema["properties"].items()}
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types and not ({"pattern", "enum", "const", "format"} & set(schema)):
        out["pattern"] = NO_NUL
    if "object" in types:
        out.setdefault("propertyNames", {"pattern": NO_NUL})
        if "additionalProperties" not in schema or schema["additionalProperties"] is True:
            out["additionalProperties"] = _STORABLE_REF
    return out


def request_structs() -> list[type[msgspec.Struct]]:
    """Every request body type: the subclasses of ``Input`` (each forbids unknown fields)."""
    found: list[type[msgspec.Struct]] = []
    pending: list[type[msgspec.Struct]] = [Input]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                pending.append(sub)
    return found


def tighten(document: dict[str, Any], routes: Iterable[Any], *, max_batch_size: int) -> None:
    """Make Litestar's generated document as strict as the server, in place.

    - request bodies are described by msgspec's own schema of the Structs the server decodes
      them with: ``additionalProperties: false``, ``exclusiveMinimum``, patterns and enums
      exactly as enforced;
    - a body the handler does not need (a ``data`` parameter with a default) is optional;
    - the public routes (the authentication middleware's exclusions) need no token;
    - every operation lists the errors it can answer, each with the error envelope;
    - answers that carry an id link to the operations that take it.
    """
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    structs = [s for s in request_structs() if s.__name__ in schemas]
    if structs:
        _, components = msgspec.json.schema_components(structs, ref_template=_COMPONENT_REF)
        schemas.update({name: storable(schema) for name, schema in components.items()})
        schemas[STORABLE_JSON] = STORABLE_JSON_SCHEMA
    envelope = {"$ref": _COMPONENT_REF.format(name="ErrorEnvelope")}
    optional_bodies = {
        (route.path_format, method.lower())
        for route in routes
        for handler in getattr(route, "route_handlers", ())
        for method in handler.http_methods
        if (data := handler.parsed_fn_signature.parameters.get("data")) is not None and data.has_default
    }
    for path, item in document.get("paths", {}).items():
        public = any(re.match(pattern, path) for pattern in PUBLIC_PATHS)
        for method in _OPERATION_METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            body = operation.get("requestBody")
            if body is not None and (path, method) in optional_bodies:
                body["required"] = False
            if path == TOOL_CALLS_PATH and method == "post" and body is not None:
                media = body["content"]["application/json"]
                media["schema"] = storable(media["schema"])
                media["schema"]["properties"]["tool_calls"]["maxItems"] = max_batch_size
            for parameter in operation.get("parameters", []):
                if "schema" in parameter:
                    parameter["schema"] = storable(parameter["schema"])
            if (path, method) in STREAMED:
                operation["responses"]["200"].setdefault("content", {})["text/event-stream"] = {
                    "schema": {
                        "description": STREAMED[(path, method)],
                        "type": "object",
                        "required": ["data"],
                        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                    }
                }
            statuses = _statuses(operation, public=public)
            responses = operation.setdefault("responses", {})
            for status in statuses:
                responses.setdefault(
                    str(status),
                    {
                        "description": ERROR_DESCRIPTIONS[status],
                        "content": {"application/json": {"schema": envelope}},
                    },
                )
            if public:
                operation["security"] = []
    add_links(document.get("paths", {}))


def _statuses(operation: dict[str, Any], *, public: bool) -> list[int]:
    """The errors that follow from the operation's shape (a route adds its own, e.g. 409 or 422)."""
    # 400 on every route: the app refuses a query parameter that is not storable text (a NUL,
    # a lone surrogate) before any handler, whether the route reads the query or not.
    statuses: list[int] = [400]
    parameters = operation.get("parameters", [])
    has_body = "requestBody" in operation
    if has_body:
        statuses.append(413)
    if not public:
        # Every authenticated route reads the token's tenant and roles from the database.
        statuses += [401, 403, 429, 503]
    if any(p.get("in") == "path" for p in parameters):
        statuses.append(404)
    return statuses


class StrictDocument:
    """Tightens the app's generated document once, the first time a render plugin serves it."""

    def __init__(self, *, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self._done: dict[str, Any] | None = None

    def __call__(self, request: Request, document: dict[str, Any]) -> dict[str, Any]:
        if self._done is not document:
            tighten(document, request.app.routes, max_batch_size=self.max_batch_size)
            self._done = document
        return document


class ContractJsonRenderPlugin(JsonRenderPlugin):
    """``/schema/openapi.json``, tightened."""

    def __init__(self, strict: StrictDocument) -> None:
        super().__init__()
        self.strict = strict

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.strict(request, openapi_schema))
