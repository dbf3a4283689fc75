"""Managing a tenant's webhooks: what the admin API, the console and ``gateway webhooks`` share.

Every change (a subscription created or deleted, a dead-lettered delivery sent again) is
one transaction with its audit row. The secret is made here, returned once by ``create``
and never read back: the queries that list and get subscriptions leave it out.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from gateway.admin.service import append_admin_audit
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.settings import WebhookSettings
from gateway.webhooks import store
from gateway.webhooks.events import EVENT_TYPES, new_secret
from gateway.webhooks.urls import UrlRefused, check_url

log = structlog.get_logger("gateway.webhooks")

WEBHOOKS_MANAGE = "webhooks:manage"
MAX_SUBSCRIPTIONS_PER_TENANT = 50


@dataclass(frozen=True, slots=True)
class CreatedSubscription:
    subscription: Any
    secret: str
    """Shown once, to whoever created it."""


def _not_found(what: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, f"No such {what}.")


def _audited(row: Any) -> dict[str, Any]:
    """What the audit keeps of a subscription. Of its URL, only the origin and a sha256: its
    path or query may be a credential (a Slack incoming-webhook URL is one), and holders of
    ``audit:read`` need not hold ``webhooks:manage``."""
    url = httpx.URL(row.url)
    return {
        "id": row.id, "url_origin": f"{url.scheme}://{url.netloc.decode('ascii')}",
        "url_sha256": hashlib.sha256(row.url.encode()).hexdigest(), "events": list(row.events), "format": row.format,
    }


class WebhookService:
    def __init__(self, *, db: Database, settings: WebhookSettings) -> None:
        self._db = db
        self._settings = settings

    def check_url(self, url: str) -> None:
        """``WEBHOOK_URL_REFUSED`` unless ``url`` follows the outbound rules."""
        try:
            check_url(url, self._settings.allowed_hosts)
        except UrlRefused as exc:
            raise GatewayError(ErrorCode.WEBHOOK_URL_REFUSED, exc.reason) from None

    async def create(
        self,
        *,
        tenant_id: str,
        actor: str,
        url: str,
        events: list[str],
        format: str = "standard",
        description: str = "",
        request_id: str | None = None,
    ) -> CreatedSubscription:
        self.check_url(url)
        unknown = sorted(set(events) - set(EVENT_TYPES))
        if unknown or not events:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"events must be some of {', '.join(EVENT_TYPES)}.")
        if format not in ("standard", "slack"):
            raise GatewayError(ErrorCode.INVALID_REQUEST, "format must be standard or slack.")
        secret = new_secret()
        subscription_id = "whs_" + secrets.token_hex(12)
        chosen = [event for event in EVENT_TYPES if event in events]
        async with self._db.begin() as conn:
            if len(await store.list_subscriptions(conn, tenant_id=tenant_id)) >= MAX_SUBSCRIPTIONS_PER_TENANT:
                raise GatewayError(
                    ErrorCode.CONFLICT, f"A tenant may have at most {MAX_SUBSCRIPTIONS_PER_TENANT} webhooks."
                )
            await store.insert_subscription(
                conn, id=subscription_id, tenant_id=tenant_id, url=url, events=chosen, format=format,
                description=description, secret=secret, created_by=actor, created_at=datetime.now(UTC),
            )
            row = await store.get_subscription(conn, tenant_id=tenant_id, subscription_id=subscription_id)
            await append_admin_audit(
                conn, tenant_id=tenant_id, user_id=actor, action="webhook.create", target=f"webhook:{subscription_id}",
                before=None, after=_audited(row), request_id=request_id,
            )
        log.info("webhook_created", tenant=tenant_id, webhook=subscription_id, events=chosen, format=format)
        return CreatedSubscription(subscription=row, secret=secret)

    async def list(self, *, tenant_id: str) -> list[Any]:
        async with self._db.connect() as conn:
            return await store.list_subscriptions(conn, tenant_id=tenant_id)

    async def get(self, *, tenant_id: str, subscription_id: str) -> Any:
        async with self._db.connect() as conn:
            row = await store.get_subscription(conn, tenant_id=tenant_id, subscription_id=subscription_id)
        if row is None:
            raise _not_found("webhook")
        return row

    async def delete(self, *, tenant_id: str, actor: str, subscription_id: str, request_id: str | None = None) -> None:
        """The subscription and its deliveries, dead-lettered ones included."""
        async with self._db.begin() as conn:
            row = await store.get_subscription(conn, tenant_id=tenant_id, subscription_id=subscription_id)
            if row is None or not await store.delete_subscription(
                conn, tenant_id=tenant_id, subscription_id=subscription_id
            ):
                raise _not_found("webhook")
            await append_admin_audit(
                conn, tenant_id=tenant_id, user_id=actor, action="webhook.delete", target=f"webhook:{subscription_id}",
                before=_audited(row), after=None, request_id=request_id,
            )
        log.info("webhook_deleted", tenant=tenant_id, webhook=subscription_id)

    async def deliveries(
        self, *, tenant_id: str, subscription_id: str, state: str | None = None, limit: int = 50
    ) -> list[Any]:
        """A subscription's deliveries, newest first (``state="dead"``: the dead-lettered ones)."""
        async with self._db.connect() as conn:
            if await store.get_subscription(conn, tenant_id=tenant_id, subscription_id=subscription_id) is None:
                raise _not_found("webhook")
            return await store.list_deliveries(
                conn, tenant_id=tenant_id, subscription_id=subscription_id, state=state, limit=limit
            )

    async def dead_letters(self, *, tenant_id: str, limit: int = 50) -> list[Any]:
        """The tenant's dead-lettered deliveries over all its webhooks, newest first (the console's list)."""
        async with self._db.connect() as conn:
            return await store.list_deliveries(conn, tenant_id=tenant_id, subscription_id=None, state="dead", limit=limit)

    async def retry(
        self,
        *,
        tenant_id: str,
        actor: str,
        delivery_id: str,
        subscription_id: str | None = None,
        request_id: str | None = None,
    ) -> Any:
        """A dead-lettered delivery sent again (same ``webhook-id``) with a new retry window;
        ``409 CONFLICT`` when it is not dead-lettered."""
        now = datetime.now(UTC)
        async with self._db.begin() as conn:
            row = await store.requeue_dead(
                conn, tenant_id=tenant_id, subscription_id=subscription_id, delivery_id=delivery_id, now=now
            )
            if row is None:
                current = await store.get_delivery(conn, tenant_id=tenant_id, delivery_id=delivery_id)
                if current is None or (subscription_id is not None and current.subscription_id != subscription_id):
                    raise _not_found("delivery")
                raise GatewayError(ErrorCode.CONFLICT, f"Only a dead-lettered delivery can be retried (it is {current.state}).")
            await append_admin_audit(
                conn, tenant_id=tenant_id, user_id=actor, action="webhook.retry", target=f"webhook_delivery:{delivery_id}",
                before={"state": "dead"}, after={"state": "pending"}, request_id=request_id,
            )
        log.info("webhook_delivery_requeued", tenant=tenant_id, delivery=delivery_id)
        return row
