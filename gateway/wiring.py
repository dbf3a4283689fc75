"""The app's services as one typed value, and the slot its lifespan installs them in.

``create_app`` (gateway.app) builds them; this module only names them, so that the
dependency providers and the middleware can take them without importing the app.

The services that hold resources (the database engine, the pooled HTTP client, the
group-commit lanes, the sealer) bind to the event loop the server runs and must be
closed when it stops, so ``Services`` is made in the lifespan, complete, and installed
once in the app's ``ServicesSlot``; the slot is empty before start-up and after shutdown,
and says so instead of handing out a half-made service.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from litestar import Litestar

from gateway.admin.service import TenantAdmin
from gateway.agent.service import AgentService
from gateway.api.health import Readiness
from gateway.api.metrics import MetricsExposition
from gateway.api.schemas import Jwks
from gateway.audit.export import ExportSlots, Slots
from gateway.auth.directory import TenantDirectory
from gateway.auth.tokens import TokenVerifier
from gateway.console.oidc import OidcClient
from gateway.db.engine import Database
from gateway.execution.approvals import ApprovalService
from gateway.execution.executor import ToolExecutor
from gateway.execution.runs import RunService
from gateway.mcp.server.handler import McpServer
from gateway.observability.metrics import Metrics
from gateway.ratelimit.limiter import RateLimiter
from gateway.settings import Settings
from gateway.tools.http import ServiceCalls
from gateway.tools.registry import ToolRegistry
from gateway.webhooks.service import WebhookService

SLOT_KEY = "services"
"""The one entry of ``app.state``: the app's ``ServicesSlot``."""


@dataclass(frozen=True, slots=True)
class Services:
    """Everything a handler, a middleware or a background task of one app uses."""

    settings: Settings
    metrics: Metrics
    registry: ToolRegistry
    service_jwks: Jwks
    service_calls: ServiceCalls
    db: Database
    http: httpx.AsyncClient
    readiness: Readiness
    metrics_exposition: MetricsExposition
    token_verifier: TokenVerifier
    tenant_directory: TenantDirectory
    executor: ToolExecutor
    approvals: ApprovalService
    runs: RunService
    tenant_admin: TenantAdmin
    rate_limiter: RateLimiter | None
    audit_exports: ExportSlots
    audit_verifies: Slots
    agent: AgentService
    mcp: McpServer
    webhooks: WebhookService
    console_oidc: OidcClient | None = None
    """The console's OpenID Connect sign-in, when a provider is configured."""


class ServicesSlot:
    """Where one app's ``Services`` are while its lifespan runs."""

    __slots__ = ("_services",)

    def __init__(self) -> None:
        self._services: Services | None = None

    def install(self, services: Services) -> None:
        if self._services is not None:
            raise RuntimeError("the app's services are installed already: one lifespan at a time")
        self._services = services

    def remove(self) -> None:
        self._services = None

    @property
    def installed(self) -> Services | None:
        """The services, or None outside the lifespan (for a caller that then steps aside)."""
        return self._services

    @property
    def services(self) -> Services:
        services = self._services
        if services is None:
            raise RuntimeError("the app's services exist only while its lifespan runs")
        return services


def services_of(app: Litestar) -> Services:
    """The services of a running app (operators' tools and tests; handlers get theirs injected)."""
    slot = app.state.get(SLOT_KEY)
    if not isinstance(slot, ServicesSlot):
        raise RuntimeError("not an app made by gateway.app.create_app")
    return slot.services
