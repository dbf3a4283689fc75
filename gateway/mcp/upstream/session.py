"""One MCP session with one upstream server, made with the SDK's client.

The session (``initialize`` handshake, then requests on the streamable HTTP transport) lives
in a task of its own, because the SDK's transport and session are scopes that must be left
by the task that entered them. Calls and listings use it from any task. A session that
failed (the server went away, forgot it, answered nonsense) is dropped; the next listing or
call opens a new one; the dropped session ends once the requests in flight on it are
answered, so one call's failure (a 404 from a server behind a balancer, a listing that timed
out) never cuts another's answer.

Nothing waits on a server unbounded: opening is bounded by the open timeout and by the
caller's own deadline, and a dropped session's task ends it upstream in the background,
within the open timeout too. A server that drips its answers defeats the HTTP client's read
timeout, so these bounds are the task's, not the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import jsonschema_rs
import msgspec
import mcp_types as types
import structlog
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.mcp.upstream.config import McpServerSpec
from gateway.mcp.upstream.transport import GATEWAY_AUDIENCE, LIST_RESPONSE_LIMIT

log = structlog.get_logger("gateway.mcp.upstream")

MAX_LIST_PAGES = 20
"""Most pages of ``tools/list`` read in one refresh: a server that pages forever cannot stall it."""
CLIENT_INFO = types.Implementation(name="gateway", version="1")
CLOSE_GRACE_S = 1.0
"""What a session task may take past its own bound to end once cancelled (at shutdown)."""


class GatewayClientSession(ClientSession):
    """The SDK's client session, checking a tool's structured answer against the output schema
    the server listed with jsonschema-rs instead of the SDK's ``jsonschema``: that one matches
    ``pattern`` with Python's backtracking ``re`` on the event loop, where a server's
    ``^(a+)+$`` and a 30-byte answer hold every tenant's requests for hours, beyond any
    timeout; jsonschema-rs with its non-backtracking engine matches in linear time. A schema
    that references itself or is large is not checked (``_unbounded``), nor a tool this
    session has not listed: the SDK would list the tools first, in the caller's context."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._output_checks: dict[str, tuple[object, Any]] = {}

    async def validate_tool_result(self, name: str, result: Any) -> None:
        schema = self._tool_output_schemas.get(name)
        if schema is None:
            return
        if result.structured_content is None and "structured_content" not in result.model_fields_set:
            raise RuntimeError(f"Tool {name} has an output schema but did not return structured content")
        if not _output_check(self._output_checks, name, schema).is_valid(result.structured_content):
            raise RuntimeError(f"Invalid structured content returned by tool {name}")


def _output_check(checks: dict[str, tuple[object, Any]], name: str, schema: dict[str, Any]) -> Any:
    """The compiled check of the schema the session holds for ``name`` now (a new listing
    brings a new schema object)."""
    known = checks.get(name)
    if known is not None and known[0] is schema:
        return known[1]
    check: Any = _UNCHECKED
    if not _unbounded(schema):
        try:
            # offline: a schema must never make the gateway fetch anything. The regex engine
            # without backtracking: a backreference or lookaround makes the schema invalid.
            check = jsonschema_rs.validator_for(schema, offline=True, pattern_options=jsonschema_rs.RegexOptions())
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError, RecursionError):
            raise RuntimeError(f"Invalid output schema for tool {name}") from None
    checks[name] = (schema, check)
    return check


class _Unchecked:
    @staticmethod
    def is_valid(instance: object) -> bool:
        return True


_UNCHECKED = _Unchecked()
MAX_CHECKED_SCHEMA_BYTES = 64 * 1024
_REFERENCES = (b'"$ref"', b'"$dynamicRef"', b'"$recursiveRef"')


def _unbounded(schema: dict[str, Any]) -> bool:
    """A schema whose check could take unbounded time on the event loop, left unchecked (the
    answer is still cut and encoded as any tool's): references, which can fan out doubly at
    each level (2^40 checks from 3 KB), or a schema past 64 KB."""
    try:
        encoded = msgspec.json.encode(schema)
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
        return True
    return len(encoded) > MAX_CHECKED_SCHEMA_BYTES or any(key in encoded for key in _REFERENCES)


class SessionUnavailable(Exception):
    """No session could be opened; ``reason`` is safe to log and to show an operator."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class UpstreamSession:
    def __init__(self, spec: McpServerSpec, client: httpx2.AsyncClient, *, open_timeout_s: float) -> None:
        self.spec = spec
        self._client = client
        self._open_timeout_s = open_timeout_s
        self._lock = asyncio.Lock()
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Every session task not yet ended: the current one and those still closing."""
        self._leases: dict[ClientSession, int] = {}
        """Requests in flight, by the session they use."""
        self._retired: dict[ClientSession, asyncio.Event] = {}
        """Dropped sessions with requests in flight: each ends when its last one is answered."""

    async def session(self) -> ClientSession:
        session = self._session
        if session is not None and self._task is not None and not self._task.done():
            return session
        async with self._lock:
            if self._session is not None and self._task is not None and not self._task.done():
                return self._session
            self.drop()
            return await self._open_locked()

    async def _open_locked(self) -> ClientSession:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[ClientSession] = loop.create_future()
        stop = asyncio.Event()
        scope = anyio.CancelScope()
        # A context of its own: the session's requests (initialize, its event stream) must never
        # carry the identity of the call that happened to open it.
        task = loop.create_task(self._hold(ready, stop, scope), name=f"mcp-session-{self.spec.name}",
                                context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            async with asyncio.timeout(self._open_timeout_s):
                session = await asyncio.shield(ready)
        except BaseException as exc:
            # Failed, timed out, or the caller was cancelled (its own timeout): the task is
            # cancelled, never waited for, so nobody holding the lock waits on the server.
            scope.cancel()
            ready.cancel()  # nobody reads it any more
            if isinstance(exc, TimeoutError):
                raise SessionUnavailable(f"no answer to initialize within {self._open_timeout_s:g} s") from None
            raise
        self._session, self._task, self._stop = session, task, stop
        return session

    async def _hold(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event, scope: anyio.CancelScope) -> None:
        GATEWAY_AUDIENCE.set(self.spec.audience)
        try:
            # Cancelling an anyio scope cancels every later wait in it too: a plain task.cancel()
            # lands once, and the transport's clean-up (its DELETE) would then wait unbounded.
            with scope:
                async with streamable_http_client(
                    self.spec.url, http_client=self._client, max_sse_event_size=LIST_RESPONSE_LIMIT
                ) as (read, write):
                    async with GatewayClientSession(
                        read, write, read_timeout_seconds=self._open_timeout_s, client_info=CLIENT_INFO
                    ) as session:
                        try:
                            await session.initialize()
                            # The SDK sends a call's x-mcp-header arguments as headers only
                            # for a tool it has listed on this session: list here, with the
                            # gateway's own token, never in a caller's context.
                            await _pages_of_tools(session)
                            if not ready.done():
                                ready.set_result(session)
                            await stop.wait()
                        finally:
                            # Leaving is bounded: the HTTP client's read timeout never fires
                            # against a server that answers the DELETE one byte at a time.
                            scope.deadline = anyio.current_time() + self._open_timeout_s
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(SessionUnavailable("the session was closed while opening"))
            raise
        except BaseException as exc:  # noqa: BLE001 - the SDK raises groups of anything; all mean "no session"
            reason = describe_failure(exc)
            if not ready.done():
                ready.set_exception(SessionUnavailable(reason))
            else:
                log.info("mcp_session_ended", server=self.spec.name, reason=reason)
        finally:
            if not ready.done():
                ready.set_exception(SessionUnavailable("the session ended before it was ready"))

    async def list_tools(self) -> list[types.Tool]:
        async with self.lease() as session:
            return await _pages_of_tools(session)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[ClientSession]:
        """The session for one request, held until it is answered: dropped meanwhile, the
        session ends only after its last request."""
        session = await self.session()
        self._leases[session] = self._leases.get(session, 0) + 1
        try:
            yield session
        finally:
            left = self._leases.pop(session) - 1
            if left:
                self._leases[session] = left
            else:
                stop = self._retired.pop(session, None)
                if stop is not None:
                    stop.set()

    def drop(self, failed: ClientSession | None = None) -> None:
        """Forget the session (it failed): the next use opens a new one. ``failed``: the
        session a request failed on; one already replaced is no reason to drop its successor.
        The session's task ends it in the background once its requests in flight are answered
        (each has its own deadline), within the open timeout; nothing waits for it."""
        if failed is not None and failed is not self._session:
            return
        if self._stop is not None:
            if self._session is not None and self._leases.get(self._session):
                self._retired[self._session] = self._stop
            else:
                self._stop.set()
        self._session = self._task = self._stop = None

    async def close(self) -> None:
        """Ends every session task of this server, waiting for them no longer than they may take."""
        self.drop()
        for stop in self._retired.values():
            stop.set()
        self._retired.clear()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=self._open_timeout_s + CLOSE_GRACE_S)
        for task in pending:
            task.cancel()


def describe_failure(exc: BaseException) -> str:
    """A short reason for a log line and the readiness report: the kind of failure, never a
    text the upstream wrote."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx2.ConnectError):
        return "connection refused or unreachable"
    if isinstance(exc, httpx2.TransportError):
        return f"transport error ({type(exc).__name__})"
    if isinstance(exc, MCPError):
        return "connection closed" if exc.code == types.CONNECTION_CLOSED else f"MCP error {exc.code}"
    return type(exc).__name__


async def _pages_of_tools(session: ClientSession) -> list[types.Tool]:
    """The server's tools, page after page (at most ``MAX_LIST_PAGES``)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools
