"""The webhooks page: the tenant's subscriptions, a form to add one (its secret shown once, on
the answer to the form), deletion after a confirmation, and the dead-lettered deliveries
with a button that sends one again. Everything goes through ``WebhookService`` (the admin
API's service: the same checks, the same ``admin_change`` audit rows).

URLs are shown in full, as the admin API shows them to the same holders of
``webhooks:manage``; they are never logged (docs/webhooks.md)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import FromPath

from gateway.api.context import request_id_of
from gateway.api.params import RESOURCE_ID_PATTERN
from gateway.api.webhooks import WebhookCreate, webhook_view
from gateway.console.approvals import nav_count, require
from gateway.console.web import PREFIX, SignedIn, checked_form, page, redirect, services_of, signed_in
from gateway.errors import ErrorCode, GatewayError
from gateway.webhooks.events import EVENT_TYPES
from gateway.webhooks.service import WEBHOOKS_MANAGE
from gateway.webhooks.urls import MAX_URL_LENGTH

PAGE = f"{PREFIX}/webhooks"
DEAD_LETTERS_SHOWN = 50
MAX_DESCRIPTION = 500
FORMATS = ("standard", "slack")
EVENT_FIELD = "event."
"""A checkbox per event, ``event.approval.created=on``: the console's forms take one value per field."""
CREATE_FIELDS = frozenset({"url", "format", "description", *(EVENT_FIELD + event for event in EVENT_TYPES)})
DONE = {"deleted": "The webhook was deleted, with its deliveries."}
_ID = re.compile(RESOURCE_ID_PATTERN)


def check_id(value: str, what: str) -> None:
    """An id no webhook or delivery can have is simply not found (the API's rule for path ids)."""
    if _ID.fullmatch(value) is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No such {what}.")


def empty_form() -> dict[str, Any]:
    return {"url": "", "events": [], "format": "standard", "description": ""}


async def webhooks_page_for(
    request: Request[Any, Any, Any], me: SignedIn, *, status: int = 200, error: str | None = None,
    done: str | None = None, form: dict[str, Any] | None = None, retry_error: str | None = None,
) -> Response[str]:
    webhooks = services_of(request).webhooks
    tenant_id = me.principal.tenant_id
    subscriptions = [webhook_view(row) for row in await webhooks.list(tenant_id=tenant_id)]
    dead = await webhooks.dead_letters(tenant_id=tenant_id, limit=DEAD_LETTERS_SHOWN)
    return page(
        "webhooks.html", status=status, me=me, pending=await nav_count(request, me), section="webhooks",
        subscriptions=subscriptions, dead=dead, described={item.id: item.description for item in subscriptions},
        event_types=EVENT_TYPES, formats=FORMATS, form=form or empty_form(), error=error, done=done,
        retry_error=retry_error, max_url=MAX_URL_LENGTH, max_description=MAX_DESCRIPTION,
    )


@get("/webhooks", include_in_schema=False)
async def webhooks_page(request: Request) -> Response[str]:
    me = await signed_in(request)
    require(me, WEBHOOKS_MANAGE)
    done = DONE.get(request.query_params.get("done", ""))
    retried = request.query_params.get("retried", "")
    if retried and _ID.fullmatch(retried):
        done = f"The delivery {retried} is queued again: the next round of the delivery worker sends it."
    return await webhooks_page_for(request, me, done=done)


def create_form(fields: dict[str, str]) -> tuple[dict[str, Any], str | None]:
    """What the form asked for (to show it again) and, if it cannot be a webhook, why in words."""
    form = {
        "url": fields.get("url", "").strip(),
        "events": [event for event in EVENT_TYPES if fields.get(EVENT_FIELD + event) == "on"],
        "format": fields.get("format", "standard"),
        "description": fields.get("description", "").strip(),
    }
    if set(fields) - CREATE_FIELDS:
        return form, "The form has a field this console does not send. Reload the page and try again."
    if not form["url"]:
        return form, "Give the URL deliveries are sent to."
    if len(form["url"]) > MAX_URL_LENGTH:
        return form, f"The URL is longer than {MAX_URL_LENGTH} characters."
    if not form["events"]:
        return form, "Choose at least one event."
    if form["format"] not in FORMATS:
        return form, "Choose the format: standard or slack."
    if len(form["description"]) > MAX_DESCRIPTION:
        return form, f"The description is longer than {MAX_DESCRIPTION} characters."
    return form, None


@post("/webhooks", include_in_schema=False, status_code=201)
async def create_webhook(request: Request) -> Response[str]:
    """The answer to the form is the page that shows the secret, its only showing: not a
    redirect, so that the secret never goes in a URL (and ``Cache-Control: no-store``)."""
    me = await signed_in(request)
    fields = await checked_form(request, me.csrf_token)
    require(me, WEBHOOKS_MANAGE)
    form, problem = create_form(fields)
    if problem is not None:
        return await webhooks_page_for(request, me, status=400, error=problem, form=form)
    try:
        data = msgspec.convert(form, WebhookCreate)  # the API's limits, checked the API's way
    except msgspec.ValidationError:
        return await webhooks_page_for(request, me, status=400, form=form,
                                       error="The webhook is not valid: check the URL, the events and the format.")
    try:
        created = await services_of(request).webhooks.create(
            tenant_id=me.principal.tenant_id, actor=me.principal.user_id, url=data.url, events=list(data.events),
            format=data.format, description=data.description, request_id=request_id_of(request.scope),
        )
    except GatewayError as exc:
        message = f"The URL was refused: {exc.message}" if exc.code is ErrorCode.WEBHOOK_URL_REFUSED else exc.message
        return await webhooks_page_for(request, me, status=exc.status, error=message, form=form)
    return page("webhook_created.html", status=201, me=me, pending=await nav_count(request, me), section="webhooks",
                webhook=webhook_view(created.subscription), secret=created.secret)


@get("/webhooks/{webhook_id:str}/delete", include_in_schema=False)
async def delete_confirmation(request: Request, webhook_id: FromPath[str]) -> Response[str]:
    me = await signed_in(request)
    require(me, WEBHOOKS_MANAGE)
    check_id(webhook_id, "webhook")
    row = await services_of(request).webhooks.get(tenant_id=me.principal.tenant_id, subscription_id=webhook_id)
    return page("webhook_delete.html", me=me, pending=await nav_count(request, me), section="webhooks",
                webhook=webhook_view(row))


@post("/webhooks/{webhook_id:str}/delete", include_in_schema=False, status_code=303)
async def delete_webhook(request: Request, webhook_id: FromPath[str]) -> Response[Any]:
    me = await signed_in(request)
    await checked_form(request, me.csrf_token)
    require(me, WEBHOOKS_MANAGE)
    check_id(webhook_id, "webhook")
    await services_of(request).webhooks.delete(
        tenant_id=me.principal.tenant_id, actor=me.principal.user_id, subscription_id=webhook_id,
        request_id=request_id_of(request.scope),
    )
    return redirect(f"{PAGE}?done=deleted")


@post("/webhooks/{webhook_id:str}/deliveries/{delivery_id:str}/retry", include_in_schema=False, status_code=303)
async def retry_delivery(request: Request, webhook_id: FromPath[str], delivery_id: FromPath[str]) -> Response[Any]:
    """A dead-lettered delivery due again at once (same ``webhook-id``, a new retry window)."""
    me = await signed_in(request)
    await checked_form(request, me.csrf_token)
    require(me, WEBHOOKS_MANAGE)
    check_id(webhook_id, "webhook")
    check_id(delivery_id, "delivery")
    try:
        await services_of(request).webhooks.retry(
            tenant_id=me.principal.tenant_id, actor=me.principal.user_id, subscription_id=webhook_id,
            delivery_id=delivery_id, request_id=request_id_of(request.scope),
        )
    except GatewayError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise
        return await webhooks_page_for(request, me, status=exc.status, retry_error=exc.message)
    return redirect(f"{PAGE}?retried={delivery_id}")


HANDLERS = [webhooks_page, create_webhook, delete_confirmation, delete_webhook, retry_delivery]
