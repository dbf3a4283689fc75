"""The methods of the MCP endpoint, one POST at a time.

``initialize`` (earlier revisions) opens a session: a new run with the tenant's defaults,
whose id is the ``Mcp-Session-Id``. ``server/discover`` (2026-07-28) needs no session.
``tools/list`` answers what the caller may call; ``tools/call`` goes through the guarded
executor exactly like ``POST /v1/runs/{run_id}/tool-calls``: same guards in the same order,
same codes, same audit rows (with this request's id).

The ``tool_call_id`` of a call is the gateway's: for a call that needs approval, derived
from the tool and its canonical arguments (``call_hash``), so repeating the same call in
the same run answers the same approval and, once approved and executed, its one stored
outcome; otherwise unique per call.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.executor import ToolExecutor
from gateway.execution.guards.permission import allows
from gateway.execution.ledger import Ledger, RunNotFound
from gateway.execution.policy import needs_approval
from gateway.execution.protocol import MAX_TOOL_NAME_LENGTH, ToolCallRequest
from gateway.execution.results import error_detail
from gateway.mcp.server.listing import ToolListing
from gateway.mcp.server.protocol import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
    JsonRpcError,
    Message,
    read_message,
)
from gateway.mcp.server.results import call_result, error_result
from gateway.mcp.server.runs import McpRuns
from gateway.observability.timing import UNTIMED, StageTimer
from gateway.settings import Settings
from gateway.text import is_storable
from gateway.tools.base import ArgumentsInvalid, call_hash
from gateway.tools.registry import ToolRegistry

log = structlog.get_logger("gateway.mcp")

RUN_ID_META_KEY = "gateway/run_id"
"""Where a caller names the run a ``tools/call`` counts against (``params._meta``)."""

SESSION_HEADER = "mcp-session-id"
SERVER_INFO = {"name": "gateway", "version": "1"}
CAPABILITIES = {"tools": {"listChanged": False}}
SESSION_ID = re.compile(r"^run_[0-9a-f]{32}$")
ROUTING_HEADERS = ("mcp-protocol-version", "mcp-method", "mcp-name")


@dataclass(slots=True)
class Answer:
    status: int
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One POST as the handler sees it: who, with which token, its routing headers and body."""

    principal: Principal
    token: str
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes
    request_id: str | None
    timer: StageTimer = UNTIMED

    def header(self, name: str) -> str | None:
        key = name.encode()
        for header, value in self.headers:
            if header == key:
                return value.decode("latin-1")
        return None


_encoder = msgspec.json.Encoder()


def rpc_result(request_id: int | str, result: dict[str, Any]) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": request_id, "result": result})


def rpc_error(error: JsonRpcError) -> bytes:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return _encoder.encode({"jsonrpc": "2.0", "id": error.id, "error": body})


def error_answer(error: JsonRpcError, headers: dict[str, str] | None = None) -> Answer:
    return Answer(status=error.status, body=rpc_error(error), headers=headers or {})


class McpServer:
    def __init__(
        self, *, settings: Settings, registry: ToolRegistry, executor: ToolExecutor, ledger: Ledger, runs: McpRuns
    ) -> None:
        self._ledger = ledger
        self._max_depth = settings.requests.max_json_depth
        self._registry = registry
        self._executor = executor
        self._runs = runs
        self._listing = ToolListing(registry)

    async def post(self, exchange: Exchange) -> Answer:
        try:
            message = read_message(exchange.body, max_depth=self._max_depth)
        except JsonRpcError as error:
            return error_answer(error)
        version = exchange.header("mcp-protocol-version")
        modern = version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        if message.id is None:
            return self._notification(message, version, modern)
        session = exchange.header(SESSION_HEADER) if not modern else None
        echo = {SESSION_HEADER: session} if session is not None else {}
        try:
            if modern:
                check_envelope(message, exchange)
            result, headers = await self._dispatch(message, exchange, modern=modern, session=session)
        except JsonRpcError as error:
            error.id = message.id
            return error_answer(error, echo)
        if modern:
            result["resultType"] = "complete"
        return Answer(status=200, body=rpc_result(message.id, result), headers={**echo, **headers})

    @staticmethod
    def _notification(message: Message, version: str | None, modern: bool) -> Answer:
        """Accepted and dropped: no notification a client may send changes anything here."""
        if modern and version not in MODERN_PROTOCOL_VERSIONS:
            return error_answer(unsupported_version(version or ""))
        return Answer(status=202, body=None)

    async def _dispatch(
        self, message: Message, exchange: Exchange, *, modern: bool, session: str | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        method = message.method
        if method == "tools/call":
            return await self._call_tool(message.params, exchange, modern=modern, session=session), {}
        if method == "tools/list":
            result: dict[str, Any] = {"tools": self._listing.tools_json(exchange.principal)}
            if modern:
                result.update(ttlMs=0, cacheScope="private")
            return result, {}
        if method == "initialize" and not modern:
            return await self._initialize(message.params, exchange.principal)
        if method == "server/discover" and modern:
            return {
                "supportedVersions": list(MODERN_PROTOCOL_VERSIONS),
                "capabilities": CAPABILITIES,
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {SERVER_INFO_META_KEY: SERVER_INFO},
            }, {}
        if method == "ping" and not modern:
            return {}, {}
        raise JsonRpcError(METHOD_NOT_FOUND, "Method not found.")

    async def _initialize(self, params: dict[str, Any], principal: Principal) -> tuple[dict[str, Any], dict[str, str]]:
        requested = params.get("protocolVersion")
        version = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
        run_id = await self._runs.session_run(principal)
        log.info("mcp_session_opened", run=run_id, protocol_version=version)
        result = {"protocolVersion": version, "capabilities": CAPABILITIES, "serverInfo": SERVER_INFO}
        return result, {SESSION_HEADER: run_id}

    async def _call_tool(
        self, params: dict[str, Any], exchange: Exchange, *, modern: bool, session: str | None
    ) -> dict[str, Any]:
        principal = exchange.principal
        run_id, from_session = await self._run_of(params, exchange, modern=modern, session=session)
        if len(run_id) > 128 or not is_storable(run_id):
            return error_result(error_detail(ErrorCode.NOT_FOUND, "No such run."))
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        problem = None
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_TOOL_NAME_LENGTH:
            problem = 'Invalid params: "name" must be a tool name.'
        elif not isinstance(arguments, dict):
            problem = 'Invalid params: "arguments" must be an object.'
        if problem is not None:
            await self._audit_refusal(principal, run_id, problem, exchange.request_id)
            raise JsonRpcError(INVALID_PARAMS, problem)
        assert isinstance(name, str)
        raw = msgspec.json.encode(arguments)
        call = ToolCallRequest(id=self._call_id(principal, name, raw), name=name, arguments=raw)
        exchange.timer.begin()
        try:
            (message,) = await self._executor.execute(
                principal, run_id, [call], request_id=exchange.request_id, timer=exchange.timer
            )
        except GatewayError as exc:
            if from_session and exc.code is ErrorCode.NOT_FOUND:
                raise JsonRpcError(INVALID_REQUEST, "Session not found.", status=404) from None
            return error_result(error_detail(exc.code, exc.message))
        return call_result(message)

    async def _run_of(
        self, params: dict[str, Any], exchange: Exchange, *, modern: bool, session: str | None
    ) -> tuple[str, bool]:
        """The run the call counts against, and whether it is the session's."""
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            raise JsonRpcError(INVALID_PARAMS, 'Invalid params: "_meta" must be an object.')
        named_run = meta.get(RUN_ID_META_KEY) if meta else None
        if named_run is not None:
            if not isinstance(named_run, str):
                raise JsonRpcError(INVALID_PARAMS, f'Invalid params: "_meta.{RUN_ID_META_KEY}" must be a string.')
            return named_run, False
        if modern:
            try:
                return await self._runs.token_run(exchange.principal, exchange.token), False
            except ValueError:
                raise JsonRpcError(INVALID_REQUEST, "The bearer token names no run.") from None
        if session is not None:
            if not SESSION_ID.fullmatch(session):
                raise JsonRpcError(INVALID_REQUEST, "Session not found.", status=404)
            return session, True
        raise JsonRpcError(
            INVALID_REQUEST, f"Missing session: send initialize first, or name a run in _meta.{RUN_ID_META_KEY}."
        )

    async def _audit_refusal(self, principal: Principal, run_id: str, problem: str, request_id: str | None) -> None:
        """A call too malformed to run is audited against its run, as the REST route audits a
        refused batch (nothing is stored when the run is not the caller's)."""
        try:
            await self._ledger.reject_batch(
                principal, run_id, ErrorCode.INVALID_TOOL_CALL, problem, request_id=request_id, now=datetime.now(UTC)
            )
        except RunNotFound:
            pass

    def _call_id(self, principal: Principal, name: str, raw: bytes) -> str:
        """Derived from the call when it needs approval (the same call answers the same approval),
        otherwise unique. A call the caller may not make gets a unique id: its refusal must not
        be the stored answer to the same call once the caller may make it."""
        tool = self._registry.get(name)
        if (
            tool is not None
            and allows(principal, tool)
            and needs_approval(tool, principal.tool_policies.for_tool(name))
        ):
            try:
                canonical = tool.arguments.decode(raw).canonical
            except ArgumentsInvalid:
                canonical = None
            if canonical is not None:
                return "mcp_" + call_hash(name, canonical)
        return "mcp_" + uuid.uuid4().hex


def unsupported_version(requested: str) -> JsonRpcError:
    return JsonRpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        data={"supported": list(MODERN_PROTOCOL_VERSIONS), "requested": requested},
    )


def check_envelope(message: Message, exchange: Exchange) -> None:
    """The 2026-07-28 per-request envelope, checked as the SDK's server checks it: ``_meta``
    carries the protocol version and client capabilities, the routing headers appear once
    and match the body, and the version is one this server speaks."""
    meta = message.params.get("_meta")
    if not isinstance(meta, dict):
        raise JsonRpcError(
            INVALID_PARAMS,
            f"params._meta must be an object carrying {PROTOCOL_VERSION_META_KEY!r} and {CLIENT_CAPABILITIES_META_KEY!r}",
        )
    missing = [key for key in (PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY) if key not in meta]
    if missing:
        raise JsonRpcError(INVALID_PARAMS, f"params._meta is missing the required envelope key(s): {', '.join(missing)}")
    seen = [name for name, _ in exchange.headers if name.decode("latin-1") in ROUTING_HEADERS]
    if len(seen) != len(set(seen)):
        raise JsonRpcError(HEADER_MISMATCH, "A routing header appears more than once.")
    version = meta[PROTOCOL_VERSION_META_KEY]
    if exchange.header("mcp-protocol-version") != version:
        raise JsonRpcError(HEADER_MISMATCH, "mcp-protocol-version header does not match the envelope's version")
    if exchange.header("mcp-method") != message.method:
        raise JsonRpcError(HEADER_MISMATCH, "mcp-method header does not match the request body's method")
    if message.method == "tools/call":
        name = message.params.get("name")
        if name is not None and _header_value(exchange.header("mcp-name")) != name:
            raise JsonRpcError(HEADER_MISMATCH, "mcp-name header does not match the request body's 'name' parameter")
    if not isinstance(version, str):
        raise JsonRpcError(INVALID_PARAMS, "the protocol-version envelope value must be a string")
    if version not in MODERN_PROTOCOL_VERSIONS:
        raise unsupported_version(version)


def _header_value(value: str | None) -> str | None:
    """A header value as sent, or decoded from the ``=?base64?...?=`` form the SDK uses for
    values that are not plain ASCII."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
