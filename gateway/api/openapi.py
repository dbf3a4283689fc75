"""OpenAPI helpers: documented error responses, and request bodies a handler decodes itself.

The tool-calls route reads its raw body so that a malformed batch is still audited and
answered ``422 INVALID_TOOL_CALL``; ``raw_json_body`` keeps its request schema in the
OpenAPI document all the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)

from gateway.api.schemas import ErrorEnvelope
from gateway.tools.base import inline_json_schema

ERROR_DESCRIPTIONS = {
    400: "Invalid request (INVALID_REQUEST)",
    401: "Missing or invalid bearer token (UNAUTHENTICATED)",
    403: "Not permitted (FORBIDDEN, TENANT_DISABLED, SELF_APPROVAL_FORBIDDEN)",
    404: "Not found in the caller's tenant (NOT_FOUND)",
    409: "Conflict (ALREADY_DECIDED, APPROVAL_EXPIRED, RUN_NOT_RESUMABLE)",
    413: "Body too large (PAYLOAD_TOO_LARGE)",
    422: "Protocol error: nothing ran (INVALID_TOOL_CALL, DUPLICATE_TOOL_CALL_ID)",
    429: "Over the tenant's or user's rate limit (RATE_LIMITED); see Retry-After",
    502: "The model provider failed (UPSTREAM_UNAVAILABLE, UPSTREAM_BAD_RESPONSE, UPSTREAM_REJECTED)",
    503: "Database unavailable (SERVICE_UNAVAILABLE) or no model provider (MODEL_NOT_CONFIGURED)",
    504: "The model provider did not answer in time (UPSTREAM_TIMEOUT)",
}


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
