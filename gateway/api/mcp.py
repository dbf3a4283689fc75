"""``/mcp``: the gateway as an MCP server (streamable HTTP), on the gateway's own route.

Plain JSON answers, one per POST (the SDK's client accepts them in both eras; no SSE
stream is opened, so ``GET`` answers 405). ``DELETE`` ends a session from the client's
side; its run stays until it expires, like any run. The caller is the verified bearer
token's, through the same middleware as the REST API. Excluded from the OpenAPI document:
its body is JSON-RPC, described in docs/mcp.md.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.exceptions import HTTPException

from gateway.api.context import request_id_of
from gateway.api.dependencies import principal_of
from gateway.mcp.server.handler import SESSION_HEADER, Answer, Exchange, error_answer
from gateway.mcp.server.metadata import MCP_PATH
from gateway.mcp.server.protocol import INVALID_REQUEST, JsonRpcError
from gateway.observability.timing import timer_of
from gateway.wiring import services_of

JSON = "application/json"


def _answer(answer: Answer) -> Response[bytes]:
    return Response(
        content=answer.body or b"",
        status_code=answer.status,
        headers=answer.headers,
        media_type=JSON,
    )


def _media_types(value: str) -> list[str]:
    return [part.split(";", 1)[0].strip().lower() for part in value.split(",")]


def _bearer_token(scope: Any) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1").partition(" ")[2].strip()
    return ""


@post(MCP_PATH, include_in_schema=False, status_code=200)
async def mcp_post(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One JSON-RPC request or notification; the answer is one JSON-RPC response (or 202)."""
    content_type = request.headers.get("content-type")
    if content_type is None or _media_types(content_type)[0] != JSON:
        return _answer(error_answer(JsonRpcError(INVALID_REQUEST, "Content-Type must be application/json.", status=415)))
    accept = request.headers.get("accept")
    if accept is not None and not {JSON, "application/*", "*/*"} & set(_media_types(accept)):
        return _answer(error_answer(JsonRpcError(INVALID_REQUEST, "Accept must allow application/json.", status=406)))
    try:
        body = await request.body()
    except HTTPException as exc:
        if exc.status_code != 413:
            raise
        return _answer(error_answer(JsonRpcError(INVALID_REQUEST, "The body is too large.", status=413)))
    scope = request.scope
    exchange = Exchange(
        principal=principal_of(request),
        token=_bearer_token(scope),
        headers=scope["headers"],
        body=body,
        request_id=request_id_of(scope),
        timer=timer_of(scope),
    )
    return _answer(await services_of(request.app).mcp.post(exchange))


@get(MCP_PATH, include_in_schema=False)
async def mcp_get() -> Response[bytes]:
    """No server-initiated stream: the spec's answer is 405."""
    return Response(content=b"", status_code=405, headers={"Allow": "POST, DELETE"}, media_type=JSON)


@delete(MCP_PATH, include_in_schema=False, status_code=200)
async def mcp_delete(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The client ends its session; the session's run expires on its own."""
    if request.headers.get(SESSION_HEADER) is None:
        return _answer(error_answer(JsonRpcError(INVALID_REQUEST, "No session to end.")))
    return Response(content=b"", status_code=200, media_type=JSON)
