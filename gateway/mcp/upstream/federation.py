"""The MCP servers of the tools file behind the guard: their included tools listed at start
and every ``GATEWAY_MCP_REFRESH_S``, and put into the registry in one swap per server.

A server that cannot be reached (at start or later) does not stop the gateway: its tools are
absent, ``/readyz`` names it as degraded, and the refresh after it comes back adds them again.
A listed tool that cannot be offered (a schema that cannot be made strict, a name listed twice)
is logged, naming the server, the tool and why, and left out; the server's other tools stay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import httpx2
import mcp_types as types
import structlog
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.auth.principal import Principal
from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.errors import new_error_id
from gateway.mcp.upstream.config import McpServerSpec
from gateway.mcp.upstream.session import SessionUnavailable, UpstreamSession, describe_failure
from gateway.tenant_turns import TenantTurns
from gateway.mcp.upstream.tools import federated_tool
from gateway.mcp.upstream.transport import GATEWAY_AUDIENCE, upstream_client
from gateway.settings import Settings
from gateway.tools.base import Tool
from gateway.tools.json_arguments import SchemaError
from gateway.tools.registry import ToolRegistry

log = structlog.get_logger("gateway.mcp.upstream")

GATEWAY_PRINCIPAL = Principal(tenant_id="", user_id="gateway", roles=frozenset(), permissions=frozenset())
"""Who the gateway's own requests (initialize, listing) are made as: no tenant, no roles."""

_LISTING_FAILURES = (SessionUnavailable, MCPError, httpx2.HTTPError, httpx2.StreamError, ValidationError,
                     TimeoutError, RuntimeError)


def source_of(server: str) -> str:
    return f"mcp:{server}"


class Federation:
    def __init__(
        self,
        servers: Sequence[McpServerSpec],
        *,
        registry: ToolRegistry,
        signer: ServiceTokenSigner,
        settings: Settings,
        turns: TenantTurns | None = None,
    ) -> None:
        self._servers = tuple(servers)
        self._turns = turns
        self._registry = registry
        self._signer = signer
        self._settings = settings
        self._refresh_s = settings.mcp_upstream.refresh_s
        self._list_timeout_s = settings.mcp_upstream.list_timeout_s
        self._clients: list[httpx2.AsyncClient] = []
        self._upstreams: dict[str, UpstreamSession] = {}
        self._down: dict[str, str] = {}
        self._refused: dict[str, dict[str, str]] = {}
        """Per server, the included tools left out and why: each is logged when it first happens."""
        self._task: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self._servers)

    def degraded(self) -> list[tuple[str, str]]:
        """``(component, reason)`` for each server whose tools are absent because it is unavailable."""
        return [(f"mcp_server:{name}", reason) for name, reason in sorted(self._down.items())]

    @property
    def longest_timeout_s(self) -> float:
        return max((tool.timeout_s for server in self._servers for tool in server.tools), default=0.0)

    async def start(self) -> None:
        """List every server once (bounded), then refresh in the background."""
        if not self._servers:
            return
        for server in self._servers:
            # A pool of its own for each server: calls waiting on a slow server must not take
            # the connections another server's calls need.
            client = upstream_client(
                gateway_authorization=self._gateway_authorization,
                timeout_s=max(self.longest_timeout_s, self._list_timeout_s),
                connect_timeout_s=self._settings.http.connect_timeout_s,
                max_connections=self._settings.http.max_connections,
                max_keepalive_connections=self._settings.http.max_keepalive_connections,
            )
            self._clients.append(client)
            self._upstreams[server.name] = UpstreamSession(server, client, open_timeout_s=self._list_timeout_s)
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._refresh_forever(), name="mcp-refresh")

    async def refresh(self) -> None:
        await asyncio.gather(*(self._refresh_one(server) for server in self._servers))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.gather(*(upstream.close() for upstream in self._upstreams.values()))
        clients, self._clients = self._clients, []
        await asyncio.gather(*(client.aclose() for client in clients))

    def _gateway_authorization(self, audience: str) -> str:
        return "Bearer " + self._signer.sign(GATEWAY_PRINCIPAL, audience=audience, run_id="", tool_call_id="")

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception:  # the loop outlives any one refresh; what failed is logged with its stack
                log.exception("mcp_refresh_failed", error_id=new_error_id())

    async def _refresh_one(self, server: McpServerSpec) -> None:
        upstream = self._upstreams[server.name]
        GATEWAY_AUDIENCE.set(server.audience)  # this refresh runs in a task (and context) of its own
        try:
            async with asyncio.timeout(self._list_timeout_s):
                try:
                    listed = await upstream.list_tools()
                except (MCPError, httpx2.HTTPError):
                    # The session may be one the server forgot (it restarted): once more, on a new one.
                    upstream.drop()
                    listed = await upstream.list_tools()
        except _LISTING_FAILURES as exc:
            reason = exc.reason if isinstance(exc, SessionUnavailable) else describe_failure(exc)
            if isinstance(exc, TimeoutError):
                reason = f"no tool list within {self._list_timeout_s:g} s"
            upstream.drop()
            self._registry.replace_source(source_of(server.name), [])
            if self._down.get(server.name) != reason:
                log.warning("mcp_server_unavailable", server=server.name, reason=reason)
            self._down[server.name] = reason
            return
        refusals: dict[str, str] = {}
        tools = self._tools_of(server, upstream, listed, refusals)
        for name in self._registry.replace_source(source_of(server.name), tools):
            refusals[name] = "the name is taken by another tool"
        known = self._refused.get(server.name, {})
        for tool, reason in refusals.items():
            if known.get(tool) != reason:
                log.error("mcp_tool_refused", server=server.name, tool=tool, reason=reason)
        self._refused[server.name] = refusals
        if self._down.pop(server.name, None) is not None:
            log.info("mcp_server_available", server=server.name, tools=len(tools))

    def _tools_of(
        self, server: McpServerSpec, upstream: UpstreamSession, listed: list[types.Tool], refusals: dict[str, str]
    ) -> list[Tool]:
        by_name: dict[str, list[types.Tool]] = {}
        for tool in listed:
            by_name.setdefault(tool.name, []).append(tool)
        tools: list[Tool] = []
        for spec in server.tools:
            found = by_name.get(spec.upstream_name, [])
            if len(found) != 1:
                refusals[spec.upstream_name] = "not in the server's tool list" if not found else "listed more than once"
                continue
            try:
                tools.append(federated_tool(
                    server, spec, found[0], upstream=upstream, signer=self._signer,
                    max_json_depth=self._settings.requests.max_json_depth, turns=self._turns,
                ))
            except SchemaError as exc:
                refusals[spec.upstream_name] = str(exc)
            except RecursionError:
                refusals[spec.upstream_name] = "input schema: nested too deep"
        return tools
