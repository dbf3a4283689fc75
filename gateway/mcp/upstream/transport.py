"""The HTTP client the MCP SDK talks to upstream servers through, under the gateway's rules.

- explicit timeouts and connection limits; redirects are never followed (``max_redirects=0``:
  the SDK follows a same-origin redirect only while the client's budget lasts), no cookies
  kept, no proxies or certificates from the environment;
- every response is read up to a cap and no further (``ResponseTooLarge``), so an upstream
  cannot make the gateway buffer an answer of any size;
- each request carries the identity of the call it belongs to: the SDK sends a message in
  the context of the task that sent it, so the call's ``CallScope`` (a context variable set
  around one ``tools/call``) reaches the request made for it; requests of the gateway's own
  (initialize, listing) carry the gateway's token;
- a call's failure stays the call's: the session is shared by every tenant's calls to the
  server, and the SDK ends it when a request's task raises a transport error (a timeout, a
  reset). For a call's request the transport answers in the server's place instead — a
  JSON-RPC error the SDK hands to that call alone — and a failure in the middle of an answer
  becomes a stream error, which the SDK also reports to that call alone; ``CallScope``
  records what happened, for the call's error code;
- event streams are opened only for a call, and at most ``MAX_REOPENS_PER_CALL`` times: the
  gateway takes no messages the server pushes on its own, and a server that ends each stream
  with ``retry: 0`` would otherwise have the SDK reconnect in a loop (for ever outside a call).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx2
import msgspec

MAX_REOPENS_PER_CALL = 2
"""Event streams the SDK may reopen (``Last-Event-ID``) for one call."""
LIST_RESPONSE_LIMIT = 4 * 1024 * 1024
"""Most bytes one answer to the gateway's own requests (initialize, a page of tools) may have."""
ENVELOPE_ALLOWANCE = 64 * 1024
"""What a call's answer may have beyond twice its result limit (JSON-RPC envelope, escaping, the
text and structured copies of one result): past it the answer is refused, not read."""


class ResponseTooLarge(httpx2.StreamError):
    """An upstream answer went past its cap; nothing more of it is read."""


class AnswerBroken(httpx2.StreamError):
    """A call's answer stopped in the middle (a timeout, a reset): the call fails, not the session."""


@dataclass(slots=True)
class CallScope:
    """What the requests made for one call carry and what they observed."""

    authorization: str
    response_limit: int
    timeout_s: float | None = None
    """The call's timeout, also the read timeout of its requests (a tenant's policy may set it
    above the client's own)."""
    headers: dict[str, str] = field(default_factory=dict)
    oversized: bool = False
    compressed: bool = False
    """The server compressed its answer (refused unread: it could expand past any cap)."""
    timed_out: bool = False
    """A request of the call ran out of time (its read timeout, or the deadline below)."""
    broken: bool = False
    """A request of the call failed on its way (no connection, a reset, a malformed answer)."""
    reopens: int = 0
    """Event streams reopened for the call so far."""
    session: Any = None
    """The session the call's request went on (the one to drop when it proves gone)."""
    deadline: float | None = None
    """A little after the call gives up (the event loop's clock; the SDK's own timeout ends the
    call first): no answer for it is read past it, nor an event stream reopened for it. Set
    when the call starts, so a request made again for it (the SDK reopens an event stream with
    ``Last-Event-ID``) gets no time of its own."""


CURRENT_CALL: ContextVar[CallScope | None] = ContextVar("gateway_mcp_call", default=None)
GATEWAY_AUDIENCE: ContextVar[str] = ContextVar("gateway_mcp_audience", default="")
"""The audience of the server the gateway's own requests (initialize, listing) go to: set by
the session's task and by each refresh, so that their token is one that server accepts."""


ANSWERED_HERE = -32099
"""The JSON-RPC error code of an answer the transport gave in the server's place (in the
range JSON-RPC leaves to implementations)."""


def call_response_limit(max_result_bytes: int) -> int:
    return 2 * max_result_bytes + ENVELOPE_ALLOWANCE


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(
        self, stream: httpx2.AsyncByteStream, limit: int, scope: CallScope | None, deadline: float | None
    ) -> None:
        self._stream = stream
        self._limit = limit
        self._scope = scope
        self._deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        loop = asyncio.get_running_loop()
        scope = self._scope
        chunks = aiter(self._stream)
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except httpx2.TransportError as exc:
                if scope is None:
                    raise
                _note_failure(scope, exc)
                raise AnswerBroken(f"the upstream answer broke off ({type(exc).__name__})") from None
            seen += len(chunk)
            if seen > self._limit:
                if scope is not None:
                    scope.oversized = True
                raise ResponseTooLarge("the upstream answer is larger than its limit")
            if self._deadline is not None and loop.time() > self._deadline:
                # A read timeout is per read: an answer dripped a comment a second would hold
                # the request, and its connection, after the call gave up on it (the SDK's older
                # protocol revision only notifies the server of a cancelled call).
                if scope is not None:
                    scope.timed_out = True
                raise AnswerBroken("the upstream answer took longer than its call's timeout")
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class GuardedTransport(httpx2.AsyncBaseTransport):
    """Stamps each request with its call's identity and caps what each response may hold."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, gateway_authorization: Callable[[str], str]) -> None:
        self._inner = inner
        self._gateway_authorization = gateway_authorization

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        scope = CURRENT_CALL.get()
        request.headers.pop("cookie", None)
        if request.method == "GET":
            refusal = _stream_refusal(scope)
            if refusal is not None:
                return _answered_here(request, 405, refusal)
        if scope is not None:
            request.headers["authorization"] = scope.authorization
            request.headers.update(scope.headers)
            limit = scope.response_limit
            if scope.timeout_s is not None:
                request.extensions["timeout"] = {**request.extensions.get("timeout", {}), "read": scope.timeout_s}
        else:
            request.headers["authorization"] = self._gateway_authorization(GATEWAY_AUDIENCE.get())
            limit = LIST_RESPONSE_LIMIT
        # A compressed body could expand past the cap inside one read: ask for it as sent.
        request.headers["accept-encoding"] = "identity"
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            if scope is None:  # the gateway's own request (initialize, a listing): the session's
                raise
            _note_failure(scope, exc)
            return _answered_here(request, 504 if scope.timed_out else 502,
                                  f"the request to the MCP server failed ({type(exc).__name__})")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            if scope is None:
                raise httpx2.DecodingError("the upstream sent a compressed answer", request=request)
            scope.compressed = True
            return _answered_here(request, 502, "the MCP server sent a compressed answer")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _CappedStream(response.stream, limit, scope, scope.deadline if scope is not None else None)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _stream_refusal(scope: CallScope | None) -> str | None:
    """Why an event stream is not opened (``None``: it is)."""
    if scope is None:
        # The SDK's stream for messages the server sends on its own: the gateway takes none.
        return "the gateway opens no event stream outside a call"
    if scope.deadline is not None and asyncio.get_running_loop().time() >= scope.deadline:
        # An event stream reopened for a call that has given up. (A POST past it is the SDK
        # telling the server the call was cancelled: that one goes.)
        scope.timed_out = True
        return "the call's time is up"
    if scope.reopens >= MAX_REOPENS_PER_CALL:
        scope.broken = True
        return "the call's event stream was reopened too often"
    scope.reopens += 1
    return None


def _note_failure(scope: CallScope, exc: httpx2.TransportError) -> None:
    if isinstance(exc, httpx2.TimeoutException):
        scope.timed_out = True
    else:
        scope.broken = True


def _answered_here(request: httpx2.Request, status: int, reason: str) -> httpx2.Response:
    """An answer in the server's place: a JSON-RPC error, which the SDK gives to the request's
    caller alone (a raised error would end the session every tenant shares)."""
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": None, "error": {"code": ANSWERED_HERE, "message": reason}})
    return httpx2.Response(status, headers={"content-type": "application/json"}, content=body, request=request)


def upstream_client(
    *,
    gateway_authorization: Callable[[str], str],
    timeout_s: float,
    connect_timeout_s: float,
    max_connections: int,
    max_keepalive_connections: int,
) -> httpx2.AsyncClient:
    """One pooled client for every MCP server of the process (see the module's rules)."""
    inner = httpx2.AsyncHTTPTransport(
        limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive_connections),
        trust_env=False,
    )
    return httpx2.AsyncClient(
        transport=GuardedTransport(inner, gateway_authorization),
        timeout=httpx2.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
        follow_redirects=False,
        max_redirects=0,
        trust_env=False,
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        headers={"user-agent": "gateway"},
    )
