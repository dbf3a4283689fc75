"""``create_app(settings)``: the only place that wires routes, middleware, handlers and resources."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import httpx
from litestar import Litestar
from litestar.middleware.base import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import ScalarRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from gateway.admin.service import TenantAdmin
from gateway.api.admin import RoleAdminController, TenantAdminController, ToolPolicyAdminController
from gateway.api.approvals import AdminApprovalController, ApprovalController
from gateway.api.audit import AuditController
from gateway.agent.service import AgentService
from gateway.api.approvals import AdminApprovalController, ApprovalController
from gateway.api.chat import ChatController
from gateway.api.context import RequestContextMiddleware
from gateway.api.errors import EXCEPTION_HANDLERS
from gateway.api.health import healthz, readyz
from gateway.api.runs import RunController
from gateway.api.tools import ToolController
from gateway.audit.sealer import AuditSealer
from gateway.auth.directory import TenantDirectory
from gateway.auth.jwks import JwksCache
from gateway.auth.middleware import PUBLIC_PATHS, JWTAuthenticationMiddleware
from gateway.auth.tokens import TokenVerifier
from gateway.db.engine import Database
from gateway.execution.approvals import ApprovalService
from gateway.execution.executor import ToolExecutor
from gateway.execution.ledger import create_ledger
from gateway.execution.runs import RunService
from gateway.llm.providers import ModelProviders
from gateway.settings import Settings
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry

__all__ = ["create_app"]


def create_app(settings: Settings, *, registry: ToolRegistry | None = None) -> Litestar:
    """Build the application. Nothing here does I/O: resources are made in the lifespan."""
    tools = registry if registry is not None else ToolRegistry(builtin_tools())

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        db = Database.from_settings(settings)
        http = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
            follow_redirects=False,
        )
        jwks = (
            JwksCache(settings.jwks_url, http, cache_s=settings.jwks_cache_s, timeout_s=settings.jwks_timeout_s)
            if settings.jwks_url
            else None
        )
        directory = TenantDirectory(db, ttl_s=settings.policy_cache_s)
        ledger = create_ledger(db, approval_ttl=timedelta(seconds=settings.approval_ttl_s))
        state = app.state
        state.settings = settings
        state.db = db
        state.http = http
        state.registry = tools
        state.token_verifier = TokenVerifier(settings, jwks)
        state.tenant_directory = directory
        state.executor = ToolExecutor(settings=settings, db=db, registry=tools, ledger=ledger)
        state.approvals = ApprovalService(settings=settings, db=db, registry=tools, directory=directory)
        state.runs = RunService(settings=settings, db=db, directory=directory)
        state.tenant_admin = TenantAdmin(db=db, registry=tools, directory=directory)
        sealer = AuditSealer(
            db, batch_size=settings.audit_seal_batch_size, interval_s=settings.audit_seal_interval_s
        )
        sealer.start()
        state.agent = AgentService(
            settings=settings,
            db=db,
            executor=state.executor,
            registry=tools,
            runs=state.runs,
            providers=ModelProviders(settings, http),
            directory=directory,
        )
        try:
            yield
        finally:
            await sealer.stop()
            await ledger.close()
            await http.aclose()
            await db.dispose()

    app = Litestar(
        route_handlers=[
            healthz,
            readyz,
            RunController,
            ToolController,
            ApprovalController,
            AdminApprovalController,
            RoleAdminController,
            ToolPolicyAdminController,
            TenantAdminController,
            AuditController,
            ChatController,
        ],
        middleware=[DefineMiddleware(JWTAuthenticationMiddleware, exclude=PUBLIC_PATHS)],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        lifespan=[lifespan],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="gateway",
            version="1",
            description="A guarded, multi-tenant tool gateway for LLM agents.",
            path="/schema",
            render_plugins=[ScalarRenderPlugin()],
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
    # Outside Litestar's exception handling, so every response (404s of unknown routes
    # included) carries the request id and every log line of the request is bound to it.
    app.asgi_handler = RequestContextMiddleware(app.asgi_handler)
    return app
