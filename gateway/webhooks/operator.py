"""``gateway webhooks ...``: the operator's hands on a tenant's webhooks, through ``WebhookService``.

    gateway webhooks list --tenant T
    gateway webhooks create --tenant T --url URL --event E [--event E ...] [--format standard|slack]
    gateway webhooks delete --tenant T WEBHOOK_ID
    gateway webhooks deliveries --tenant T WEBHOOK_ID [--state dead] [--limit N]
    gateway webhooks retry --tenant T DELIVERY_ID

Changes are audited in the tenant's chain as ``operator:cli``. ``create`` prints the
signing secret once; nothing prints it again.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import exc as sa_exc

from gateway.admin.operator import OPERATOR, OperatorError
from gateway.db.engine import Database
from gateway.errors import GatewayError
from gateway.settings import WebhookSettings
from gateway.webhooks.events import EVENT_TYPES
from gateway.webhooks.service import WebhookService
from gateway.webhooks.store import DELIVERY_STATES


def add_parser(commands: Any) -> argparse.ArgumentParser:
    webhooks = commands.add_parser("webhooks", help="a tenant's webhooks: list, create, delete, deliveries, retry")
    actions = webhooks.add_subparsers(dest="webhooks_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the tenant's webhooks (never their secrets)")
    listing.add_argument("--tenant", required=True)
    create = actions.add_parser("create", help="a new webhook; prints its signing secret once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--url", required=True)
    create.add_argument("--event", action="append", dest="events", required=True, choices=EVENT_TYPES,
                        help="an event to send (repeat for several)")
    create.add_argument("--format", choices=("standard", "slack"), default="standard")
    create.add_argument("--description", default="")
    remove = actions.add_parser("delete", help="delete a webhook and its unsent deliveries")
    remove.add_argument("--tenant", required=True)
    remove.add_argument("webhook_id")
    deliveries = actions.add_parser("deliveries", help="a webhook's deliveries, newest first")
    deliveries.add_argument("--tenant", required=True)
    deliveries.add_argument("webhook_id")
    deliveries.add_argument("--state", choices=DELIVERY_STATES, help="only these (dead: dead-lettered)")
    deliveries.add_argument("--limit", type=int, default=50)
    retry = actions.add_parser("retry", help="send a dead-lettered delivery again")
    retry.add_argument("--tenant", required=True)
    retry.add_argument("delivery_id")
    return webhooks


def action(args: argparse.Namespace, settings: WebhookSettings) -> Callable[[Database], Awaitable[str]]:
    """The command as an operator action on the database; ``OperatorError`` says why it failed."""

    async def run(db: Database) -> str:
        service = WebhookService(db=db, settings=settings)
        try:
            return await _run(service, args)
        except GatewayError as exc:
            raise OperatorError(exc.message) from None
        except sa_exc.IntegrityError:  # the tenant's row is what a new webhook refers to
            raise OperatorError(f"no tenant {args.tenant!r}") from None

    return run


async def _run(service: WebhookService, args: argparse.Namespace) -> str:
    tenant = args.tenant
    command = args.webhooks_command
    if command == "list":
        rows = await service.list(tenant_id=tenant)
        return "\n".join(_webhook_line(row) for row in rows) if rows else f"tenant {tenant} has no webhooks"
    if command == "create":
        created = await service.create(
            tenant_id=tenant, actor=OPERATOR, url=args.url, events=args.events, format=args.format,
            description=args.description,
        )
        return "\n".join([
            f"created {_webhook_line(created.subscription)}",
            f"secret (shown this once; deliveries are signed with it): {created.secret}",
        ])
    if command == "delete":
        await service.delete(tenant_id=tenant, actor=OPERATOR, subscription_id=args.webhook_id)
        return f"deleted webhook {args.webhook_id}"
    if command == "deliveries":
        if not 1 <= args.limit <= 1000:
            raise OperatorError("--limit must be between 1 and 1000")
        rows = await service.deliveries(
            tenant_id=tenant, subscription_id=args.webhook_id, state=args.state, limit=args.limit
        )
        return "\n".join(_delivery_line(row) for row in rows) if rows else "no deliveries"
    row = await service.retry(tenant_id=tenant, actor=OPERATOR, delivery_id=args.delivery_id)
    return f"delivery {row.id} is due again ({row.event_type})"


def _webhook_line(row: Any) -> str:
    return f"{row.id}  {row.format:8}  {','.join(row.events)}  {row.url}"


def _delivery_line(row: Any) -> str:
    status = row.last_status if row.last_status is not None else "-"
    return (f"{row.id}  {row.event_type:16}  {row.state:9}  attempts={row.attempts}  "
            f"last={status}/{row.last_error or '-'}  created={row.created_at.isoformat()}")
