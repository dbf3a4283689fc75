"""An included upstream tool as a gateway tool: its strict schema, its policy, its handler.

| the upstream answers | the model gets |
|---|---|
| a result | ``{"ok": true, "result": ...}``: ``structuredContent`` if present, else the text content (cut past the limit) |
| ``isError: true`` | ``TOOL_EXECUTION_FAILED`` (or ``BUSINESS_RULE_VIOLATION`` where the file says so), with the result's text cut and control characters removed |
| a JSON-RPC error, a broken or refused connection, a protocol error | ``TOOL_EXECUTION_FAILED``, details logged under ``error_id`` |
| nothing in time | ``TOOL_TIMEOUT``; the request is cancelled upstream (``notifications/cancelled``) |
| an answer past its size cap, NUL or lone surrogates, nesting past the depth limit | ``TOOL_EXECUTION_FAILED`` (not retryable) |
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx2
import mcp_types as types
import msgspec
import structlog
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.errors import ERRORS, ErrorCode, ToolError, new_error_id
from gateway.mcp.upstream.config import McpServerSpec, McpToolSpec
from gateway.mcp.upstream.session import SessionUnavailable, UpstreamSession
from gateway.mcp.upstream.transport import CURRENT_CALL, CallScope, call_response_limit
from gateway.observability.timing import elapsed_ms
from gateway.tenant_turns import TenantTurns
from gateway.text import holds_non_finite, holds_unstorable, nests_deeper_than, storable_text
from gateway.tools.base import Tool, ToolContext
from gateway.tools.http import call_idempotency_key
from gateway.tools.json_arguments import JsonSchemaArguments, SchemaError, strict_schema
from gateway.tools.scrub import Sensitive

log = structlog.get_logger("gateway.mcp.upstream")

MAX_DESCRIPTION_CHARS = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_CONNECTION_CLOSED = types.CONNECTION_CLOSED
_FORGOTTEN = "Session terminated"
"""What the SDK's transport says when the server answered 404 to a request of a known session."""
_SESSION_LOST = (_FORGOTTEN, "Connection closed")


def effective_mutates(declared: bool | None, annotations: types.ToolAnnotations | None) -> bool:
    """Whether calls of the tool change data. The file decides when it says; otherwise an
    upstream ``destructiveHint: true`` makes the tool mutating. An annotation only ever
    tightens: ``readOnlyHint`` never makes a mutating tool read-only."""
    if declared is not None:
        return declared
    return annotations is not None and annotations.destructive_hint is True


def clean_text(text: str, max_chars: int) -> str:
    """Control characters (NUL and line breaks included) replaced by a space, lone surrogates
    (which UTF-8 cannot encode) by U+FFFD, cut to ``max_chars``."""
    text = storable_text(_CONTROL.sub(" ", text)).strip()
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


def federated_tool(
    server: McpServerSpec,
    spec: McpToolSpec,
    listed: types.Tool,
    *,
    upstream: UpstreamSession,
    signer: ServiceTokenSigner,
    max_json_depth: int,
    turns: TenantTurns | None = None,
) -> Tool:
    """The gateway tool for ``listed``; ``SchemaError`` names the path of a schema that cannot be made strict."""
    if holds_unstorable(listed.input_schema):
        # It would reach the model (and the database) as text nothing can encode or store.
        raise SchemaError("input schema: holds a NUL character or a lone surrogate")
    try:
        schema = strict_schema(listed.input_schema)
        arguments = JsonSchemaArguments(schema, spec.sensitive_fields)
    except SchemaError as exc:
        raise SchemaError(f"input schema: {exc}") from None
    mutates = effective_mutates(spec.mutates, listed.annotations)
    description = clean_text(listed.description or "", MAX_DESCRIPTION_CHARS) or (
        f"The tool {spec.upstream_name} of the MCP server {server.name}."
    )
    handler = McpToolHandler(
        server=server, spec=spec, upstream=upstream, signer=signer, mutates=mutates, max_json_depth=max_json_depth,
        turns=turns,
    )
    return Tool(
        name=spec.name,
        description=description,
        arguments=arguments,
        handler=handler,
        permission=spec.permission,
        mutates=mutates,
        timeout_s=spec.timeout_s,
        max_result_bytes=spec.max_result_bytes,
        sensitive_fields=spec.sensitive_fields,
        remote=True,
    )


CALL_DEADLINE_GRACE_S = 1.0
"""How long after a call's timeout its requests' answers stop being read (``CallScope.deadline``):
the SDK's timeout answers the call first, as ``TOOL_TIMEOUT``."""


class McpToolHandler:
    def __init__(
        self,
        *,
        server: McpServerSpec,
        spec: McpToolSpec,
        upstream: UpstreamSession,
        signer: ServiceTokenSigner,
        mutates: bool,
        max_json_depth: int,
        turns: TenantTurns | None = None,
    ) -> None:
        self._server = server
        self._turns = turns
        self._spec = spec
        self._upstream = upstream
        self._signer = signer
        self._mutates = mutates
        self._max_json_depth = max_json_depth
        self._log_fields = {"tool": spec.name, "server": server.name, "upstream_tool": spec.upstream_name}

    async def __call__(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> object:
        max_result_bytes = ctx.max_result_bytes or self._spec.max_result_bytes
        scope = CallScope(
            authorization="Bearer " + self._signer.sign(
                ctx.principal, audience=self._server.audience, run_id=ctx.run_id, tool_call_id=ctx.tool_call_id
            ),
            response_limit=call_response_limit(max_result_bytes),
            timeout_s=ctx.timeout_s or self._spec.timeout_s,
            headers=self._headers(ctx),
        )
        scope.deadline = asyncio.get_running_loop().time() + scope.timeout_s + CALL_DEADLINE_GRACE_S
        started = time.perf_counter()
        token = CURRENT_CALL.set(scope)
        try:
            try:
                result = await self._call_in_turn(ctx, arguments, scope)
            except MCPError as exc:
                if exc.message != _FORGOTTEN:
                    raise
                # The server no longer knows the session (it restarted) and refused the request
                # unread: once more, on a new session.
                self._upstream.drop(scope.session)
                result = await self._call_in_turn(ctx, arguments, scope)
        except SessionUnavailable as exc:
            raise self._failed("mcp_call_unreachable", "The MCP server could not be reached.", started,
                               reason=exc.reason) from None
        except MCPError as exc:
            raise await self._mcp_error(exc, scope, started, arguments) from None
        except httpx2.TimeoutException:
            log.warning("mcp_call_timed_out", **self._log_fields, duration_ms=elapsed_ms(started))
            raise ToolError(ErrorCode.TOOL_TIMEOUT, "The MCP server did not answer in time.") from None
        except (httpx2.HTTPError, httpx2.StreamError, ValidationError, RuntimeError) as exc:
            # This call's answer, not the session: other calls (other tenants') share the
            # session and go on. A session that is really gone fails its next use, and that is
            # when it is dropped (SessionUnavailable, a closed connection, a forgotten session).
            raise self._failed("mcp_call_failed", "The MCP server answered in a way this tool does not expect.",
                               started, retryable=False, error_type=type(exc).__name__) from None
        finally:
            CURRENT_CALL.reset(token)
        if not isinstance(result, types.CallToolResult):
            raise self._failed("mcp_call_failed", "The MCP server answered in a way this tool does not expect.",
                               started, retryable=False, problem="not_a_tool_result")
        log.debug("mcp_call_finished", **self._log_fields, is_error=result.is_error, duration_ms=elapsed_ms(started))
        return self._result(result, started, arguments)

    async def _call_in_turn(self, ctx: ToolContext, arguments: Mapping[str, Any], scope: CallScope) -> Any:
        if self._turns is None:
            return await self._call(arguments, scope)
        async with self._turns.turn(ctx.principal.tenant_id):
            return await self._call(arguments, scope)

    async def _call(self, arguments: Mapping[str, Any], scope: CallScope) -> types.CallToolResult:
        async with self._upstream.lease() as session:
            scope.session = session
            # The call's own timeout, not the session's (the listing timeout, for initialize and tools/list).
            return await session.call_tool(
                self._spec.upstream_name, dict(arguments), read_timeout_seconds=scope.timeout_s
            )

    def _headers(self, ctx: ToolContext) -> dict[str, str]:
        headers: dict[str, str] = {}
        if ctx.request_id:
            headers["x-request-id"] = ctx.request_id
        key = ctx.idempotency_key or (call_idempotency_key(ctx) if self._mutates else None)
        if key:
            headers["idempotency-key"] = key
        return headers

    async def _mcp_error(
        self, exc: MCPError, scope: CallScope, started: float, arguments: Mapping[str, Any]
    ) -> ToolError:
        # The server's words go to the log: without the call's sensitive values it may quote.
        said = clean_text(Sensitive(arguments, self._spec.sensitive_fields).text(exc.message), 200)
        if scope.oversized:
            return self._failed("mcp_call_refused_answer", "The MCP server answered with more than this tool accepts.",
                                started, retryable=False, problem="too_large")
        if scope.compressed:
            return self._failed("mcp_call_refused_answer", "The MCP server answered in a way this tool does not expect.",
                                started, retryable=False, problem="compressed")
        if exc.code == types.REQUEST_TIMEOUT or scope.timed_out:
            log.warning("mcp_call_timed_out", **self._log_fields, duration_ms=elapsed_ms(started))
            return ToolError(ErrorCode.TOOL_TIMEOUT, "The MCP server did not answer in time.")
        if exc.message in _SESSION_LOST:
            self._upstream.drop(scope.session)
            return self._failed("mcp_call_unreachable", "The MCP server could not be reached.", started,
                                mcp_code=exc.code)
        if scope.broken or exc.code == _CONNECTION_CLOSED:
            # This call's request or event stream failed on its way (the session's own end, above,
            # is "Connection closed"): the session, which other calls share, stays.
            return self._failed("mcp_call_unreachable", "The MCP server could not be reached.", started,
                                mcp_code=exc.code, mcp_message=said)
        # The upstream's own words go to the log (cut), never to the model.
        return self._failed("mcp_call_failed", "The MCP server failed to handle the request.", started,
                            mcp_code=exc.code, mcp_message=said)

    def _failed(self, event: str, message: str, started: float, *, retryable: bool | None = None,
                **fields: Any) -> ToolError:
        error_id = new_error_id()
        log.warning(event, **self._log_fields, error_id=error_id, duration_ms=elapsed_ms(started), **fields)
        return ToolError(ErrorCode.TOOL_EXECUTION_FAILED, message, retryable=retryable, error_id=error_id)

    def _result(self, result: types.CallToolResult, started: float, arguments: Mapping[str, Any]) -> object:
        texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
        if result.is_error:
            # The text reaches the model and the audit: without the call's sensitive values.
            raise self._is_error(Sensitive(arguments, self._spec.sensitive_fields).text(" ".join(texts)), started)
        if result.structured_content is not None and holds_non_finite(result.structured_content):
            # 1e400 was read as infinity and would be written back as null: the value would
            # change on its way. The text the server gave with it (MCP asks for one) goes instead.
            if not texts:
                raise self._failed("mcp_call_refused_answer", "The MCP server answered with a number JSON cannot "
                                   "hold.", started, retryable=False, problem="non_finite_number")
        elif result.structured_content is not None:
            encoded = msgspec.json.encode(result.structured_content)
            if nests_deeper_than(encoded, self._max_json_depth):
                raise self._failed("mcp_call_refused_answer", "The MCP server answered with nesting too deep to pass on.",
                                   started, retryable=False, problem="too_deep")
            if holds_unstorable(result.structured_content):
                raise self._unstorable(started)
            return msgspec.Raw(encoded)
        text = "".join(texts)
        if holds_unstorable(text):
            raise self._unstorable(started)
        return text

    def _unstorable(self, started: float) -> ToolError:
        return self._failed("mcp_call_refused_answer",
                            "The MCP server answered with text that cannot be passed on (NUL or a lone surrogate).",
                            started, retryable=False, problem="unstorable_text")

    def _is_error(self, text: str, started: float) -> ToolError:
        code = self._spec.is_error_code
        message = clean_text(text, self._server.error_message_max_chars) or ERRORS[code].message
        if code is ErrorCode.TOOL_EXECUTION_FAILED:
            error_id = new_error_id()
            log.info("mcp_call_is_error", **self._log_fields, error_id=error_id, duration_ms=elapsed_ms(started))
            return ToolError(code, message, retryable=False, error_id=error_id)
        log.info("mcp_call_refused", **self._log_fields, outcome=code.value, duration_ms=elapsed_ms(started))
        return ToolError(code, message)
