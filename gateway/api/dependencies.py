"""``provide_*`` dependencies: a handler names the service it needs as a parameter and gets
it from the app's ``Services`` (gateway.wiring), made in the lifespan.

The providers are registered once, on the app, by ``create_app``; each reads the app's own
slot, never a global. Handlers take at most one injected dependency and read the caller
from ``request.user``: Litestar resolves two or more dependencies of one level in an anyio
task group, which costs more per request (~150 µs here) than the handlers themselves.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.di import Provide

from gateway.admin.service import TenantAdmin
from gateway.agent.service import AgentService
from gateway.api.health import Readiness
from gateway.api.metrics import MetricsExposition
from gateway.api.schemas import Jwks
from gateway.audit.export import ExportSlots
from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.approvals import ApprovalService
from gateway.execution.executor import ToolExecutor
from gateway.execution.runs import RunService
from gateway.tools.registry import ToolRegistry
from gateway.webhooks.service import WebhookService
from gateway.wiring import ServicesSlot


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    principal = request.scope.get("user")
    if not isinstance(principal, Principal):
        raise GatewayError(ErrorCode.UNAUTHENTICATED)
    return principal


def service_providers(slot: ServicesSlot) -> dict[str, Provide]:
    """The services a handler may name, by parameter name."""

    def provide_runs() -> RunService:
        return slot.services.runs

    def provide_executor() -> ToolExecutor:
        return slot.services.executor

    def provide_approvals() -> ApprovalService:
        return slot.services.approvals

    def provide_registry() -> ToolRegistry:
        return slot.services.registry

    def provide_tenant_admin() -> TenantAdmin:
        return slot.services.tenant_admin

    def provide_agent() -> AgentService:
        return slot.services.agent

    def provide_db() -> Database:
        return slot.services.db

    def provide_audit_exports() -> ExportSlots:
        return slot.services.audit_exports

    def provide_readiness() -> Readiness:
        return slot.services.readiness

    def provide_service_jwks() -> Jwks:
        return slot.services.service_jwks

    def provide_metrics_exposition() -> MetricsExposition:
        return slot.services.metrics_exposition

    def provide_webhooks() -> WebhookService:
        return slot.services.webhooks

    providers = (
        provide_runs,
        provide_executor,
        provide_approvals,
        provide_registry,
        provide_tenant_admin,
        provide_agent,
        provide_db,
        provide_audit_exports,
        provide_readiness,
        provide_service_jwks,
        provide_metrics_exposition,
        provide_webhooks,
    )
    return {
        provider.__name__.removeprefix("provide_"): Provide(provider, sync_to_thread=False) for provider in providers
    }
