"""Tenant webhooks: ``/v1/admin/webhooks`` (permission ``webhooks:manage``).

A subscription names a URL, the events it wants and the body's format; its signing secret
is in the answer to its creation only. Each subscription lists its deliveries (the
dead-lettered ones with ``state=dead``), and a dead-lettered delivery can be sent again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.datastructures import CacheControlHeader
from litestar.di import NamedDependency
from litestar.params import JSONBody, QueryParameter

from gateway.api.context import request_id_of
from gateway.api.dependencies import principal_of
from gateway.api.openapi import error_responses
from gateway.api.params import ResourceId
from gateway.api.schemas import Input
from gateway.auth.guards import requires_permission
from gateway.errors import ErrorCode, GatewayError
from gateway.webhooks.events import EventType, Format
from gateway.webhooks.service import WEBHOOKS_MANAGE, WebhookService
from gateway.webhooks.store import DELIVERY_STATES

WebhookUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=2000, description="Where deliveries are POSTed.")]


class WebhookCreate(Input, kw_only=True, forbid_unknown_fields=True):
    url: WebhookUrl
    events: Annotated[list[EventType], msgspec.Meta(min_length=1, max_length=4)]
    format: Format = "standard"
    """`standard`: Standard Webhooks JSON; `slack`: `{"text": ...}` for a Slack incoming webhook."""
    description: Annotated[str, msgspec.Meta(max_length=500)] = ""


class WebhookView(msgspec.Struct):
    id: str
    url: str
    events: list[str]
    format: str
    description: str
    created_by: str
    created_at: datetime


class WebhookCreated(WebhookView):
    secret: str
    """`whsec_` and base64: the key deliveries are signed with. Shown in this answer only."""


class WebhookList(msgspec.Struct):
    items: list[WebhookView]


class DeliveryView(msgspec.Struct):
    id: str
    """The `webhook-id` header of every attempt."""
    webhook_id: str
    event_type: str
    state: str
    """`pending`, `in_flight`, `delivered` or `dead` (dead-lettered)."""
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None
    dead_at: datetime | None


class DeliveryList(msgspec.Struct):
    items: list[DeliveryView]


def webhook_view(row: Any) -> WebhookView:
    return WebhookView(
        id=row.id, url=row.url, events=list(row.events), format=row.format, description=row.description,
        created_by=row.created_by, created_at=row.created_at,
    )


def delivery_view(row: Any) -> DeliveryView:
    return DeliveryView(
        id=row.id, webhook_id=row.subscription_id, event_type=row.event_type, state=row.state,
        attempts=row.attempts, created_at=row.created_at,
        next_attempt_at=row.next_attempt_at if row.state in ("pending", "in_flight") else None,
        last_attempt_at=row.last_attempt_at, last_status=row.last_status, last_error=row.last_error,
        delivered_at=row.delivered_at, dead_at=row.dead_at,
    )


class WebhookAdminController(Controller):
    path = "/v1/admin/webhooks"
    tags = ["admin"]
    guards = [requires_permission(WEBHOOKS_MANAGE)]

    @post(
        "/", status_code=201, summary="Create a webhook", responses=error_responses(400, 401, 403, 409, 503),
        cache_control=CacheControlHeader(no_store=True),
    )
    async def create_webhook(
        self, request: Request, webhooks: NamedDependency[WebhookService], data: JSONBody[WebhookCreate]
    ) -> WebhookCreated:
        """The answer carries the signing secret, once. A URL that breaks the outbound rules
        (not https, credentials, a loopback or private address not allow-listed) is
        `400 WEBHOOK_URL_REFUSED`."""
        principal = principal_of(request)
        created = await webhooks.create(
            tenant_id=principal.tenant_id, actor=principal.user_id, url=data.url, events=list(data.events),
            format=data.format, description=data.description, request_id=request_id_of(request.scope),
        )
        view = webhook_view(created.subscription)
        return WebhookCreated(**msgspec.structs.asdict(view), secret=created.secret)

    @get("/", summary="List the tenant's webhooks", responses=error_responses(401, 403, 503))
    async def list_webhooks(self, request: Request, webhooks: NamedDependency[WebhookService]) -> WebhookList:
        """Oldest first; secrets are never shown again."""
        rows = await webhooks.list(tenant_id=principal_of(request).tenant_id)
        return WebhookList(items=[webhook_view(row) for row in rows])

    @get("/{webhook_id:str}", summary="Read a webhook", responses=error_responses(400, 401, 403, 404, 503))
    async def get_webhook(
        self, request: Request, webhooks: NamedDependency[WebhookService], webhook_id: ResourceId
    ) -> WebhookView:
        return webhook_view(await webhooks.get(tenant_id=principal_of(request).tenant_id, subscription_id=webhook_id))

    @delete(
        "/{webhook_id:str}", status_code=204, summary="Delete a webhook",
        responses=error_responses(400, 401, 403, 404, 503),
    )
    async def delete_webhook(
        self, request: Request, webhooks: NamedDependency[WebhookService], webhook_id: ResourceId
    ) -> None:
        """Its deliveries not yet sent are dropped with it."""
        principal = principal_of(request)
        await webhooks.delete(
            tenant_id=principal.tenant_id, actor=principal.user_id, subscription_id=webhook_id,
            request_id=request_id_of(request.scope),
        )

    @get(
        "/{webhook_id:str}/deliveries", summary="List a webhook's deliveries",
        responses=error_responses(400, 401, 403, 404, 503),
    )
    async def list_deliveries(
        self,
        request: Request,
        webhooks: NamedDependency[WebhookService],
        webhook_id: ResourceId,
        delivery_state: Annotated[
            str | None,
            QueryParameter(
                name="state",
                description=f"One of {', '.join(DELIVERY_STATES)} (`dead`: dead-lettered)",
                schema_extra={"enum": [*DELIVERY_STATES, None]},
            ),
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 50,
    ) -> DeliveryList:
        """Newest first."""
        if delivery_state is not None and delivery_state not in DELIVERY_STATES:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"state must be one of {', '.join(DELIVERY_STATES)}.")
        rows = await webhooks.deliveries(
            tenant_id=principal_of(request).tenant_id, subscription_id=webhook_id, state=delivery_state, limit=limit
        )
        return DeliveryList(items=[delivery_view(row) for row in rows])

    @post(
        "/{webhook_id:str}/deliveries/{delivery_id:str}/retry", status_code=200,
        summary="Send a dead-lettered delivery again", responses=error_responses(400, 401, 403, 404, 409, 503),
    )
    async def retry_delivery(
        self, request: Request, webhooks: NamedDependency[WebhookService], webhook_id: ResourceId,
        delivery_id: ResourceId,
    ) -> DeliveryView:
        """Due again at once, with the same `webhook-id` and a new retry window;
        `409 CONFLICT` unless it is dead-lettered."""
        principal = principal_of(request)
        row = await webhooks.retry(
            tenant_id=principal.tenant_id, actor=principal.user_id, subscription_id=webhook_id,
            delivery_id=delivery_id, request_id=request_id_of(request.scope),
        )
        return delivery_view(row)
