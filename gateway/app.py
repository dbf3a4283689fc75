"""``create_app(settings)``: the only place that wires routes, middleware, handlers and resources."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx
import structlog
import msgspec
from litestar import Litestar
from litestar.datastructures import State
from litestar.middleware.base import DefineMiddleware
from litestar.routes import HTTPRoute
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from gateway.admin.service import TenantAdmin
from gateway.api.admin import RoleAdminController, TenantAdminController, ToolPolicyAdminController
from gateway.api.approvals import AdminApprovalController, ApprovalController
from gateway.api.audit import AuditController
from gateway.agent.service import AgentService
from gateway.api.chat import ChatController
from gateway.api.context import InFlight, RequestContextMiddleware
from gateway.api.decoding import check_request, request_class
from gateway.api.dependencies import service_providers
from gateway.api.errors import exception_handlers
from gateway.api.docs import DocsRenderPlugin
from gateway.api.health import Readiness, healthz, healthz_head, readyz, readyz_head
from gateway.api.mcp import mcp_delete, mcp_get, mcp_post
from gateway.api.metrics import DatabaseGauges, MetricsExposition, scrape_metrics
from gateway.api.oauth_metadata import gateway_resource_metadata, mcp_resource_metadata
from gateway.api.openapi import ContractJsonRenderPlugin, StrictDocument
from gateway.api.jwks import public_keys
from gateway.api.runs import RunController
from gateway.api.schemas import Jwks
from gateway.api.tools import ToolController
from gateway.api.tool_calls_lane import ToolCallsLane
from gateway.audit.export import ExportSlots, Slots
from gateway.console.routes import console_routers
from gateway.console.web import PREFIX as CONSOLE_PREFIX
from gateway.console.oidc import OidcClient
from gateway.audit.sealer import AuditSealer
from gateway.auth.directory import TenantDirectory
from gateway.auth.jwks import JwksCache
from gateway.auth.middleware import PUBLIC_PATHS, JWTAuthenticationMiddleware
from gateway.auth.service_tokens import load_service_signer
from gateway.auth.tokens import TokenVerifier
from gateway.db.engine import Database
from gateway.execution.approvals import ApprovalService
from gateway.execution.executor import ToolExecutor
from gateway.execution.ledger import create_ledger
from gateway.execution.policy import longest_timeout_s
from gateway.execution.runs import RunService
from gateway.llm.providers import ModelProviders
from gateway.mcp.server.handler import McpServer
from gateway.mcp.server.runs import McpRuns
from gateway.mcp.upstream.federation import Federation
from gateway.observability.metrics import Metrics
from gateway.ratelimit import create_rate_limiter
from gateway.ratelimit.middleware import RateLimitMiddleware
from gateway.settings import Settings, SettingsError
from gateway.tools.builtin import builtin_tools
from gateway.tools.config import load_http_tools, load_mcp_servers
from gateway.tools.http import ServiceCalls
from gateway.tools.http_transport import service_transport
from gateway.tools.registry import ToolRegistry
from gateway.api.webhooks import WebhookAdminController
from gateway.webhooks.service import WebhookService
from gateway.webhooks.worker import WebhookWorker
from gateway.wiring import SLOT_KEY, Services, ServicesSlot

log = structlog.get_logger("gateway.app")

__all__ = ["create_app"]


def interrupted_after(settings: Settings, registry: ToolRegistry) -> timedelta:
    """How long after its start a call still marked executing must have been interrupted:
    twice the longest any call may run."""
    longest = longest_timeout_s(registry, settings.tools.timeout_s)
    return timedelta(seconds=2 * longest + 2 * settings.database.statement_timeout_s)


IDENTITY_MAX_CONNECTIONS = 10
"""The identity provider's pool (JWKS, OIDC sign-in): a few requests, never queued behind others."""


def _outbound_client(settings: Settings, max_connections: int) -> tuple[httpx.AsyncClient, httpx.AsyncHTTPTransport]:
    transport = service_transport(
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=min(max_connections, settings.http.max_keepalive_connections),
        ),
    )
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(settings.tools.timeout_s, connect=settings.http.connect_timeout_s),
        transport=transport,
        follow_redirects=False,
        # A client is shared by every caller: a cookie one upstream sets for one user must
        # never ride along on another user's request.
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
    )
    return client, transport


def create_app(settings: Settings, *, registry: ToolRegistry | None = None) -> Litestar:
    """Build the application. Resources are made in the lifespan; the only I/O here is reading
    the tools file and the signing key, so that a bad one stops start-up with a clear message.

    What needs no resource (settings, metrics, the tool registry, the signer) is made here;
    the lifespan makes the rest and installs the whole as one ``Services`` in this app's
    slot, the only entry of ``app.state``. Handlers get their service from the providers
    registered below, middleware from the slot it is constructed with."""
    signer = load_service_signer(settings)
    service_calls = ServiceCalls(signer, max_calls_per_tenant=settings.tools.max_remote_calls_per_tenant)
    if registry is None:
        registry = ToolRegistry(builtin_tools())
        http_tools = load_http_tools(settings, service_calls, reserved_names=(tool.name for tool in registry))
        if http_tools and signer is None:
            raise SettingsError(
                "the tools file declares HTTP tools: set GATEWAY_SERVICE_SIGNING_KEY or "
                "GATEWAY_SERVICE_SIGNING_KEY_FILE (the key the gateway signs service tokens with)"
            )
        for tool in http_tools:
            registry.register(tool)
    mcp_servers = load_mcp_servers(settings, reserved_names=(tool.name for tool in registry))
    if mcp_servers and signer is None:
        raise SettingsError(
            "the tools file declares MCP servers: set GATEWAY_SERVICE_SIGNING_KEY or "
            "GATEWAY_SERVICE_SIGNING_KEY_FILE (the key the gateway signs identity tokens with)"
        )
    tools = registry
    service_jwks = msgspec.convert(signer.jwks() if signer is not None else {"keys": []}, Jwks)
    in_flight = InFlight()
    strict_document = StrictDocument(max_batch_size=settings.requests.max_batch_size)
    metrics = Metrics()
    slot = ServicesSlot()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        db = Database.from_settings(settings)
        # Business services, model providers and the identity provider each get a client and
        # a pool of their own: slow model answers (a chat holds its connection for the whole
        # answer) must not take the connections HTTP tools, token keys or sign-ins need.
        http, transport = _outbound_client(settings, settings.http.max_connections)
        models_http, _ = _outbound_client(settings, settings.http.max_connections)
        identity_http, _ = _outbound_client(settings, IDENTITY_MAX_CONNECTIONS)
        service_calls.attach(http, transport)
        jwks = (
            JwksCache(settings.jwks.url, identity_http, cache_s=settings.jwks.cache_s, timeout_s=settings.jwks.timeout_s)
            if settings.jwks.url
            else None
        )
        directory = TenantDirectory(db, ttl_s=settings.policy_cache_s)
        # MCP servers behind the guard: listed once here (bounded; one that is down only
        # leaves its tools out), then refreshed in the background.
        federation = (Federation(mcp_servers, registry=tools, signer=signer, settings=settings,
                                 turns=service_calls.turns) if signer else None)
        if federation:
            await federation.start()
        stale_after = interrupted_after(settings, tools)
        if federation:
            stale_after = max(stale_after, timedelta(
                seconds=2 * federation.longest_timeout_s + 2 * settings.database.statement_timeout_s))
        ledger = create_ledger(
            db,
            approval_ttl=timedelta(seconds=settings.approvals.ttl_s),
            stale_after=stale_after,
            lanes=settings.database.group_commit_lanes,
            max_requests=settings.database.group_commit_max_requests,
            overflow_after_s=settings.database.group_commit_overflow_after_s,
        )
        readiness = Readiness(db, degraded=federation.degraded if federation else None)
        executor = ToolExecutor(settings=settings, db=db, registry=tools, ledger=ledger, metrics=metrics)
        runs = RunService(settings=settings, db=db, directory=directory)
        rate_limiter = create_rate_limiter(settings, db)
        sealer = AuditSealer(
            db, batch_size=settings.audit.seal_batch_size, interval_s=settings.audit.seal_interval_s
        )
        webhook_worker = WebhookWorker(db, settings.webhooks, registry=registry)
        slot.install(
            Services(
                settings=settings,
                metrics=metrics,
                registry=tools,
                service_jwks=service_jwks,
                service_calls=service_calls,
                db=db,
                http=http,
                readiness=readiness,
                metrics_exposition=MetricsExposition(
                    metrics,
                    DatabaseGauges(db),
                    token=settings.metrics.token,
                    tenant_labels=settings.metrics.labels_tenants,
                ),
                token_verifier=TokenVerifier(settings, jwks),
                tenant_directory=directory,
                executor=executor,
                approvals=ApprovalService(
                    settings=settings, db=db, registry=tools, directory=directory, metrics=metrics
                ),
                runs=runs,
                tenant_admin=TenantAdmin(db=db, registry=tools, directory=directory),
                rate_limiter=rate_limiter,
                audit_exports=ExportSlots(
                    per_tenant=settings.audit.export_max_per_tenant,
                    per_process=settings.audit.export_max_per_process,
                    stall_timeout_s=settings.server.stream_stall_timeout_s,
                ),
                audit_verifies=Slots(
                    per_tenant=settings.audit.verify_max_per_tenant, per_process=settings.audit.verify_max_per_process
                ),
                agent=AgentService(
                    settings=settings,
                    db=db,
                    executor=executor,
                    registry=tools,
                    runs=runs,
                    providers=ModelProviders(settings, models_http, metrics),
                    directory=directory,
                ),
                mcp=McpServer(
                    settings=settings, registry=tools, executor=executor, ledger=ledger, runs=McpRuns(db=db, runs=runs)
                ),
                console_oidc=OidcClient(settings, identity_http) if settings.oidc.enabled else None,
                webhooks=WebhookService(db=db, settings=settings.webhooks),
            )
        )
        sealer.start()
        webhook_worker.start()
        # Everything made so far lives as long as the process: keep it out of the cyclic
        # garbage collector's full passes, which otherwise stall requests under load.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            # The server has stopped taking requests and waited for those in flight; wait
            # (bounded) for any still inside the app before the group-commit lanes stop.
            log.info("gateway_stopping", in_flight=in_flight.count)
            drained = await in_flight.drained(settings.server.shutdown_timeout_s)
            try:
                if rate_limiter is not None:
                    await rate_limiter.close()
                await ledger.close()
                await sealer.stop()
                await webhook_worker.stop()
                if federation:
                    await federation.close()
                service_calls.detach()
                for client in (http, models_http, identity_http):
                    await client.aclose()
                await db.dispose()
            finally:
                slot.remove()
            log.info("gateway_stopped", drained=drained)

    app = Litestar(
        route_handlers=[
            healthz,
            healthz_head,
            readyz,
            readyz_head,
            scrape_metrics,
            public_keys,
            RunController,
            ToolController,
            ApprovalController,
            AdminApprovalController,
            RoleAdminController,
            ToolPolicyAdminController,
            TenantAdminController,
            AuditController,
            ChatController,
            mcp_post,
            mcp_get,
            mcp_delete,
            gateway_resource_metadata,
            mcp_resource_metadata,
            *console_routers(),
            WebhookAdminController,
        ],
        middleware=[
            # OPTIONS too: CORS is off, so there is no preflight to let through, and an
            # unauthenticated OPTIONS must not reach a guard that needs a caller.
            DefineMiddleware(
                JWTAuthenticationMiddleware, services=slot, exclude=PUBLIC_PATHS, exclude_http_methods=()
            ),
            *([DefineMiddleware(RateLimitMiddleware, services=slot)] if settings.rate_limits.enabled else []),
        ],
        dependencies=service_providers(slot),
        state=State({SLOT_KEY: slot}),
        exception_handlers=exception_handlers(metrics),  # type: ignore[arg-type]
        # Every body and query is decoded under one rule (gateway.api.decoding).
        request_class=request_class(max_json_depth=settings.requests.max_json_depth),
        before_request=check_request,
        lifespan=[lifespan],
        request_max_body_size=settings.requests.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="gateway",
            version="1",
            description="A guarded, multi-tenant tool gateway for LLM agents.",
            path="/schema",
            render_plugins=[DocsRenderPlugin(strict_document), ContractJsonRenderPlugin(strict_document)],
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(type="http", scheme="bearer", bearer_format="JWT"),
                }
            ),
            security=[{"bearer": []}],
        ),
        logging_config=None,
        debug=False,
    )
    answer_options_with_every_method(app)
    # Outside Litestar's exception handling, so every response (404s of unknown routes
    # included) carries the request id and every log line of the request is bound to it.
    # The hot route's plain requests skip the framework's layers (gateway.api.tool_calls_lane);
    # the rest, and every error's answer, are Litestar's.
    lane = ToolCallsLane.in_front_of(app, services=slot, rate_limited=settings.rate_limits.enabled)
    app.asgi_handler = RequestContextMiddleware(
        lane, metrics=metrics, in_flight=in_flight, pages_prefix=CONSOLE_PREFIX
    )
    return app


def answer_options_with_every_method(app: Litestar) -> None:
    """Litestar's automatic OPTIONS handler answers ``Allow`` from the route it was made for; when
    the handlers of one path are registered in turns (a controller's GET and POST), the merged
    route keeps the first route's handler and ``Allow`` leaves methods out. Point each at its route."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            closure = getattr(handler.fn, "__closure__", None)
            if handler.handler_name == "options_handler" and closure and isinstance(closure[0].cell_contents, HTTPRoute):
                closure[0].cell_contents = route
