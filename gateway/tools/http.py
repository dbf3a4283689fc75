"""HTTP tools: a declared call to an internal business service, made as the caller.

Each call:
- builds its URL from the service's parsed base URL and the encoded arguments
  (``http_request.py``: no argument can choose the host or add headers);
- sends a short-lived JWT the gateway signs for that service (audience = the service;
  ``sub``, ``tenant_id``, ``roles``, ``run_id``, ``tool_call_id``), ``X-Request-ID``, and an
  ``Idempotency-Key`` when it changes data (derived from the approval when there is one);
- goes through the connection pool of the process's one ``httpx.AsyncClient``, as one
  exchange on a kept-alive connection (``ServicePool.exchange``; no redirects followed);
- reads the response body as sent, up to the tool's result limit and no further (it asks
  for ``identity``; a compressed body is refused, never inflated);
- shares a kept-alive connection only with the same user's calls, and only when nothing is
  left over from the last exchange (``http_transport.py``);
- maps the status to a stable code. From an error body only the service's declared safe
  field reaches the model, cut to a length; the rest is logged.

| service answers | the model gets |
|---|---|
| 2xx | ``{"ok": true, "result": ...}`` (JSON as sent, else text — JSON nested past the ceiling too; truncated past the limit) |
| 400, 422 | ``INVALID_ARGUMENTS`` |
| 401, 403 | ``PERMISSION_DENIED`` |
| 404, 410 | ``NOT_FOUND`` |
| 409, 412 | ``CONFLICT`` |
| 429 | ``RATE_LIMITED`` (retryable) |
| 5xx, connection errors | ``TOOL_EXECUTION_FAILED`` (retryable, details logged under ``error_id``) |
| no answer in time | ``TOOL_TIMEOUT`` (retryable) |
| anything else (3xx, other 4xx, a compressed body) | ``TOOL_EXECUTION_FAILED`` (not retryable, logged) |
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx
import msgspec
import structlog

from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.errors import ERRORS, ErrorCode, ToolError, new_error_id
from gateway.observability.timing import elapsed_ms
from gateway.tenant_turns import TenantTurns
from gateway.text import MAX_JSON_DEPTH_CEILING, nests_deeper_than
from gateway.tools.base import ArgumentsInvalid, PartialResult, Tool, ToolContext, sha256_hex
from gateway.tools.http_request import RequestTemplate, ServiceEndpoint
from gateway.tools.http_transport import (
    IDENTITY,
    EncodedBody,
    ServiceCall,
    ServicePool,
    header_value,
    pool_of,
)
from gateway.tools.json_arguments import JsonSchemaArguments
from gateway.tools.scrub import Sensitive

log = structlog.get_logger("gateway.tools.http")

ERROR_BODY_LIMIT = 4096
"""Most bytes of an error response read (to find the safe field and to log an excerpt)."""
LOG_EXCERPT_CHARS = 512

_STATUS_CODES: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_ARGUMENTS,
    422: ErrorCode.INVALID_ARGUMENTS,
    401: ErrorCode.PERMISSION_DENIED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    410: ErrorCode.NOT_FOUND,
    409: ErrorCode.CONFLICT,
    412: ErrorCode.CONFLICT,
    429: ErrorCode.RATE_LIMITED,
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_ANY_JSON = msgspec.json.Decoder()
_SENDS_BODY = frozenset({b"POST", b"PUT", b"PATCH"})
_TRANSPORT_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, httpcore.ProxyError)
"""What httpx calls a ``TransportError``, as the pool raises it: the service could not be reached."""


class ServiceCalls:
    """What the HTTP tools of one process share: the token signer, made with the app, and the
    pooled HTTP client and its transport, made in the app's lifespan and handed over with
    ``attach``.

    A call goes to the transport's connection pool itself, not through the client: the
    client's steps (default headers, cookies, redirects, auth, URL parsing, its request and
    response objects) are things a service call must not have or does without, and on this
    path they were a quarter of the gateway's CPU per HTTP tool call."""

    def __init__(self, signer: ServiceTokenSigner | None, *, max_calls_per_tenant: int) -> None:
        """``max_calls_per_tenant``: ``GATEWAY_TOOL_MAX_REMOTE_CALLS_PER_TENANT``."""
        self.signer = signer
        self.turns = TenantTurns(max_calls_per_tenant)
        """Shared with the MCP tools: one tenant's remote calls in flight at once (see ``TenantTurns``)."""
        self._client: httpx.AsyncClient | None = None
        self._pool: ServicePool | None = None

    def attach(self, client: httpx.AsyncClient, transport: httpx.AsyncHTTPTransport) -> None:
        """``transport``: the one ``client`` was made with (``service_transport``)."""
        self._client = client
        self._pool = pool_of(transport)

    def detach(self) -> None:
        self._client = None
        self._pool = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the HTTP client is not started: HTTP tools run inside the app's lifespan")
        return self._client

    @property
    def pool(self) -> ServicePool:
        if self._pool is None:
            raise RuntimeError("the HTTP client is not started: HTTP tools run inside the app's lifespan")
        return self._pool


@dataclass(frozen=True, slots=True)
class ErrorExposure:
    """Which part of a service's error body the model may read: one string field, cut short."""

    field: str | None
    max_chars: int

    def message(self, body: bytes) -> str | None:
        if self.field is None or not body or nests_deeper_than(body, MAX_JSON_DEPTH_CEILING):
            return None
        try:
            value: Any = _ANY_JSON.decode(body)
        except msgspec.DecodeError:
            return None
        for key in self.field.split("."):
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        if not isinstance(value, str):
            return None
        text = _CONTROL.sub(" ", value).strip()
        if not text:
            return None
        return text if len(text) <= self.max_chars else text[: self.max_chars - 1].rstrip() + "…"


class HttpToolHandler:
    def __init__(
        self,
        *,
        tool_name: str,
        service: ServiceEndpoint,
        request: RequestTemplate,
        calls: ServiceCalls,
        timeout_s: float,
        connect_timeout_s: float,
        max_result_bytes: int,
        mutates: bool,
        errors: ErrorExposure,
        sensitive_fields: frozenset[str] = frozenset(),
    ) -> None:
        self._tool = tool_name
        self._sensitive_fields = sensitive_fields
        self._service = service
        self._request = request
        self._calls = calls
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)).as_dict()
        self._max_result_bytes = max_result_bytes
        self._mutates = mutates
        self._errors = errors
        self._method = request.method.encode("ascii")
        self._host = service.host_header
        self._scheme = service.scheme.encode("ascii")
        self._service_host = service.host.encode("ascii")
        self._fixed_headers = (
            (b"accept", b"application/json"),
            # A compressed body could expand past the size limit inside one read: read_capped refuses it.
            *((name.encode("ascii"), value.encode("ascii")) for name, value in IDENTITY.items()),
            (b"user-agent", b"gateway"),
        )
        self._log_fields = {
            "tool": tool_name,
            "service": service.name,
            "method": request.method,
            "path": request.path_template,
        }

    async def __call__(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> object:
        try:
            url, body = self._request.build_request_target(self._service, arguments)
        except ArgumentsInvalid as exc:
            raise ToolError(ErrorCode.INVALID_ARGUMENTS, exc.message) from None
        timeout_s = ctx.timeout_s or self._timeout_s
        timeout = self._timeout if timeout_s == self._timeout_s else httpx.Timeout(
            timeout_s, connect=min(self._connect_timeout_s, timeout_s)
        ).as_dict()
        max_result_bytes = ctx.max_result_bytes or self._max_result_bytes
        call = ServiceCall(
            scheme=self._scheme,
            host=self._service_host,
            port=self._service.connect_port,
            target=url,
            method=self._method,
            headers=self._headers(ctx, body),
            body=body,
            # Only the same user's calls share a connection: see http_transport.
            partition=(ctx.principal.tenant_id, ctx.principal.user_id),
            timeouts=timeout,
            limit=max_result_bytes,
            error_limit=ERROR_BODY_LIMIT,
        )
        started = time.perf_counter()
        try:
            async with self._calls.turns.turn(ctx.principal.tenant_id):
                answer = await self._calls.pool.exchange(call)
        except httpcore.TimeoutException as exc:
            log.warning("service_call_timed_out", **self._log_fields, error_type=type(exc).__name__,
                        duration_ms=elapsed_ms(started))
            raise ToolError(
                ErrorCode.TOOL_TIMEOUT, f"The service did not answer within {timeout_s:g} s."
            ) from None
        except _TRANSPORT_ERRORS as exc:
            error_id = new_error_id()
            log.warning("service_call_failed", **self._log_fields, error_type=type(exc).__name__,
                        error_id=error_id, duration_ms=elapsed_ms(started))
            raise ToolError(
                ErrorCode.TOOL_EXECUTION_FAILED, "The service could not be reached.", error_id=error_id
            ) from None
        except EncodedBody as exc:
            if exc.status is not None and not 200 <= exc.status < 300:
                # A refusal says what it means by its status (429 and its Retry-After, a
                # retryable 503): that stands, only its compressed body goes unread.
                raise self._error(exc.status, b"", exc.headers, started) from None
            error_id = new_error_id()
            log.warning("service_call_failed", **self._log_fields, status=exc.status, error_id=error_id,
                        problem="encoded_body", content_encoding=exc.encoding, duration_ms=elapsed_ms(started))
            raise ToolError(ErrorCode.TOOL_EXECUTION_FAILED, "The service answered in a way this tool does not expect.",
                            retryable=False, error_id=error_id) from None
        status = answer.status
        if 200 <= status < 300:
            log.debug("service_call_finished", **self._log_fields, status=status, duration_ms=elapsed_ms(started))
            return self._result(answer.body, answer.complete, answer.headers)
        raise self._error(status, self._without_sensitive(answer.body, arguments), answer.headers, started)

    def _headers(self, ctx: ToolContext, body: bytes | None) -> list[tuple[bytes, bytes]]:
        """The request's headers, as the pool sends them: what httpx would add itself (``Host``,
        ``Content-Length``) included."""
        signer = self._calls.signer
        if signer is None:
            raise RuntimeError("HTTP tools need a service signing key")
        token = signer.sign(
            ctx.principal, audience=self._service.audience, run_id=ctx.run_id, tool_call_id=ctx.tool_call_id
        )
        headers = [
            (b"host", self._host),
            (b"authorization", b"Bearer " + token.encode("ascii")),
            *self._fixed_headers,
        ]
        if ctx.request_id:
            headers.append((b"x-request-id", ctx.request_id.encode("ascii")))
        idempotency_key = ctx.idempotency_key or (call_idempotency_key(ctx) if self._mutates else None)
        if idempotency_key:
            headers.append((b"idempotency-key", idempotency_key.encode("ascii")))
        if body is not None:
            headers.append((b"content-type", b"application/json"))
            headers.append((b"content-length", str(len(body)).encode("ascii")))
        elif self._method in _SENDS_BODY:
            headers.append((b"content-length", b"0"))
        return headers

    def _result(self, data: bytes, complete: bool, headers: list[tuple[bytes, bytes]]) -> object:
        if not complete:  # read_capped kept at most the call's limit
            return PartialResult(kept=data, original_bytes=_content_length(headers))
        if not data.strip():
            return None
        if nests_deeper_than(data, MAX_JSON_DEPTH_CEILING):
            # Decoding it (even to check it is JSON) would recurse until RecursionError: the
            # call would fail after the service acted. Passed on as the text it is.
            return data.decode("utf-8", errors="replace")
        try:
            # Checked whole, since what is stored must read back (a replay, an approval's
            # outcome): UTF-8 throughout and numbers a float holds (1e400 is valid JSON that
            # no reader here can hold). Then passed on as it was sent, not encoded again.
            _ANY_JSON.decode(data)
            return msgspec.json.decode(data, type=msgspec.Raw)
        except msgspec.DecodeError:
            return data.decode("utf-8", errors="replace")

    def _without_sensitive(self, data: bytes, arguments: Mapping[str, Any]) -> bytes:
        """The service's error body with this call's sensitive values taken out: it goes to
        the log's excerpt and, through the declared error field, to the model and the audit."""
        if not self._sensitive_fields or not data:
            return data
        return Sensitive(arguments, self._sensitive_fields).body(data)

    def _error(self, status: int, data: bytes, headers: list[tuple[bytes, bytes]], started: float) -> ToolError:
        excerpt = data[:LOG_EXCERPT_CHARS].decode("utf-8", errors="replace")
        code = _STATUS_CODES.get(status)
        if code is not None:
            log.info("service_call_refused", **self._log_fields, status=status, outcome=code.value,
                     response_excerpt=excerpt, duration_ms=elapsed_ms(started))
            message = self._errors.message(data) or ERRORS[code].message
            retry_after = _RETRY_AFTER_SECONDS.fullmatch(header_value(headers, b"retry-after"))
            if code is ErrorCode.RATE_LIMITED and retry_after is not None:
                message = f"{message} Retry after {int(retry_after[0])} s."
            return ToolError(code, message)
        error_id = new_error_id()
        log.warning("service_call_failed", **self._log_fields, status=status, error_id=error_id,
                    response_excerpt=excerpt, duration_ms=elapsed_ms(started))
        if status >= 500:
            return ToolError(ErrorCode.TOOL_EXECUTION_FAILED, "The service failed to handle the request.",
                             error_id=error_id)
        return ToolError(ErrorCode.TOOL_EXECUTION_FAILED, "The service answered in a way this tool does not expect.",
                         retryable=False, error_id=error_id)


_RETRY_AFTER_SECONDS = re.compile(rb"[0-9]{1,6}")
"""A service's ``Retry-After`` worth repeating to the model: ASCII digits, at most about 11
days (``str.isdigit`` also takes superscripts, which ``int`` refuses, and any length)."""


def call_idempotency_key(ctx: ToolContext) -> str:
    """For a changing call that runs without an approval: one key per call of a run."""
    material = f"gateway-call:{ctx.principal.tenant_id}:{ctx.run_id}:{ctx.tool_call_id}"
    return sha256_hex(material.encode())


_CONTENT_LENGTH = re.compile(rb"0*([0-9]{1,18})")
"""A length worth reporting: leading zeros (which the parser accepts) dropped, at most 18
digits (``int`` refuses more than 4,300, and a bytes ``isdigit`` takes any length)."""


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    match = _CONTENT_LENGTH.fullmatch(header_value(headers, b"content-length"))
    return int(match[1]) if match is not None else None



def http_tool(
    *,
    name: str,
    description: str,
    schema: Mapping[str, Any],
    permission: str,
    service: ServiceEndpoint,
    request: RequestTemplate,
    calls: ServiceCalls,
    timeout_s: float,
    connect_timeout_s: float,
    max_result_bytes: int,
    mutates: bool = False,
    sensitive_fields: frozenset[str] = frozenset(),
    errors: ErrorExposure = ErrorExposure(field=None, max_chars=200),
) -> Tool:
    """A tool that calls ``service`` as declared; ``schema`` is made strict and compiled here."""
    arguments = JsonSchemaArguments(schema, sensitive_fields, checks=[request.check_arguments])
    handler = HttpToolHandler(
        tool_name=name,
        service=service,
        request=request,
        calls=calls,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_result_bytes=max_result_bytes,
        mutates=mutates,
        errors=errors,
        sensitive_fields=sensitive_fields,
    )
    return Tool(
        name=name,
        description=description,
        arguments=arguments,
        handler=handler,
        permission=permission,
        mutates=mutates,
        timeout_s=timeout_s,
        max_result_bytes=max_result_bytes,
        sensitive_fields=sensitive_fields,
        remote=True,
    )
