"""The HTTP client the MCP SDK talks to upstream servers through, under the gateway's rules.

- explicit timeouts and connection limits; redirects are never followed (``max_redirects=0``:
  the SDK follows a same-origin redirect only while the client's budget lasts), no cookies
  kept, no proxies or certificates from the environment;
- every response is read up to a cap and no further (``ResponseTooLarge``), so an upstream
  cannot make the gateway buffer an answer of any size;
- each request carries the identity of the call it belongs to: the SDK sends a message in
  the context of the task that sent it, so the call's ``CallScope`` (a context variable set
  around one ``tools/call``) reaches the request made for it; requests of the gateway's own
  (initialize, listing) carry the gateway's token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx2

LIST_RESPONSE_LIMIT = 4 * 1024 * 1024
"""Most bytes one answer to the gateway's own requests (initialize, a page of tools) may have."""
ENVELOPE_ALLOWANCE = 64 * 1024
"""What a call's answer may have beyond twice its result limit (JSON-RPC envelope, escaping, the
text and structured copies of one result): past it the answer is refused, not read."""


class ResponseTooLarge(httpx2.StreamError):
    """An upstream answer went past its cap; nothing more of it is read."""


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
    deadline: float | None = None
    """A little after the call gives up (the event loop's clock; the SDK's own timeout ends the
    call first): no answer for it is read past it, nor an event stream reopened for it. Set
    when the call starts, so a request made again for it (the SDK reopens an event stream with
    ``Last-Event-ID``) gets no time of its own."""


CURRENT_CALL: ContextVar[CallScope | None] = ContextVar("gateway_mcp_call", default=None)
GATEWAY_AUDIENCE: ContextVar[str] = ContextVar("gateway_mcp_audience", default="")
"""The audience of the server the gateway's own requests (initialize, listing) go to: set by
the session's task and by each refresh, so that their token is one that server accepts."""


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
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                if self._scope is not None:
                    self._scope.oversized = True
                raise ResponseTooLarge("the upstream answer is larger than its limit")
            if self._deadline is not None and loop.time() > self._deadline:
                # A read timeout is per read: an answer dripped a comment a second would hold
                # the request, and its connection, after the call gave up on it (the SDK's older
                # protocol revision only notifies the server of a cancelled call).
                raise httpx2.ReadTimeout("the upstream answer took longer than its call's timeout")
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
        if (scope is not None and scope.deadline is not None and request.method == "GET"
                and asyncio.get_running_loop().time() >= scope.deadline):
            # An event stream reopened for a call that has given up. (A POST past it is the
            # SDK telling the server the call was cancelled: that one goes.)
            raise httpx2.ReadTimeout("the call's time is up", request=request)
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
        response = await self._inner.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            raise httpx2.DecodingError("the upstream sent a compressed answer", request=request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _CappedStream(response.stream, limit, scope, scope.deadline if scope is not None else None)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


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
