"""The approvals pages: what waits for a decision, one approval as it will execute, and the
decisions, all through ``ApprovalService`` (the same checks and audit rows as the API)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import FromPath

from gateway.api.approvals import approval_view
from gateway.api.context import request_id_of
from gateway.api.params import RESOURCE_ID_PATTERN
from gateway.api.schemas import ApprovalView
from gateway.auth.principal import Principal
from gateway.console.web import PREFIX, SignedIn, checked_form, page, redirect, services_of, signed_in
from gateway.db.agent_runs import load_messages
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.approvals import ApprovalService, effective_status

DECIDE = "approvals:decide"
MAX_PENDING_SHOWN = 1000
DECIDED_SHOWN = 50
PAGE = 200
_ID = re.compile(RESOURCE_ID_PATTERN)

def require(me: SignedIn, permission: str) -> None:
    if not me.principal.has(permission):
        raise GatewayError(ErrorCode.FORBIDDEN, f"This page needs the permission “{permission}”, "
                           "which your roles do not give you.")


async def pending_oldest_first(approvals: ApprovalService, principal: Principal) -> list[Any]:
    rows: list[Any] = []
    after = None
    while len(rows) < MAX_PENDING_SHOWN:
        batch = await approvals.list(principal, status="pending", limit=PAGE, after=after)
        rows.extend(batch)
        if len(batch) < PAGE:
            break
        after = (batch[-1].created_at, batch[-1].id)
    return list(reversed(rows))


def duration(seconds: float) -> str:
    seconds = int(abs(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86_400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86_400} d {seconds % 86_400 // 3600} h"


def pretty(value: Any) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


async def nav_count(request: Request[Any, Any, Any], me: SignedIn) -> int | None:
    if not me.principal.has(DECIDE):
        return None
    approvals = services_of(request).approvals
    return len(await approvals.list(me.principal, status="pending", limit=MAX_PENDING_SHOWN, after=None))


@get("/approvals", include_in_schema=False)
async def approvals_page(request: Request) -> Response[str]:
    me = await signed_in(request)
    require(me, DECIDE)
    approvals = services_of(request).approvals
    now = datetime.now(UTC)
    pending = await pending_oldest_first(approvals, me.principal)
    recent = await approvals.list(me.principal, status=None, limit=DECIDED_SHOWN * 2, after=None)
    decided = [row for row in recent if effective_status(row, now) != "pending"][:DECIDED_SHOWN]
    return page(
        "approvals.html", me=me, pending=len(pending),
        waiting=[{"row": row, "age": duration((now - row.created_at).total_seconds()),
                  "expires_in": duration((row.expires_at - now).total_seconds())} for row in pending],
        decided=[{"row": row, "status": effective_status(row, now)} for row in decided],
    )


async def last_user_message(request: Request[Any, Any, Any], principal: Principal, run_id: str) -> str | None:
    """The requester's last message to the assistant, when the call came from the agent loop."""
    async with services_of(request).db.connect() as conn:
        messages = await load_messages(conn, tenant_id=principal.tenant_id, run_id=run_id)
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                texts = [part.get("text") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
                return "\n".join(texts) if texts else None
    return None


async def detail_page(
    request: Request[Any, Any, Any], me: SignedIn, approval_id: str, *, reveal: bool, status: int = 200,
    error: str | None = None,
) -> Response[str]:
    approvals = services_of(request).approvals
    row = await approvals.get_for_approver(me.principal, approval_id, reveal=reveal,
                                           request_id=request_id_of(request.scope))
    now = datetime.now(UTC)
    view: ApprovalView = approval_view(row, approvals, now, reveal=reveal)
    return page(
        "approval.html", status=status, me=me, pending=await nav_count(request, me), view=view,
        arguments=pretty(view.arguments), revealed=reveal, error=error,
        outcome=pretty(msgspec.to_builtins(view.outcome)) if view.outcome is not None else None,
        age=duration((now - row.created_at).total_seconds()),
        expires_in=duration((row.expires_at - now).total_seconds()) if view.status == "pending" else None,
        user_message=await last_user_message(request, me.principal, row.run_id),
    )


@get("/approvals/{approval_id:str}", include_in_schema=False)
async def approval_page(request: Request, approval_id: FromPath[str]) -> Response[str]:
    me = await signed_in(request)
    require(me, DECIDE)
    check_id(approval_id)
    return await detail_page(request, me, approval_id, reveal=False)


@post("/approvals/{approval_id:str}/reveal", include_in_schema=False, status_code=200)
async def reveal_arguments(request: Request, approval_id: FromPath[str]) -> Response[str]:
    me = await signed_in(request)
    await checked_form(request, me.csrf_token)
    require(me, DECIDE)
    check_id(approval_id)
    return await detail_page(request, me, approval_id, reveal=True)


@post("/approvals/{approval_id:str}/approve", include_in_schema=False, status_code=303)
async def approve(request: Request, approval_id: FromPath[str]) -> Response[Any]:
    me = await signed_in(request)
    await checked_form(request, me.csrf_token)
    require(me, DECIDE)
    check_id(approval_id)
    approvals = services_of(request).approvals
    try:
        await approvals.approve(me.principal, approval_id, request_id=request_id_of(request.scope))
    except GatewayError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise
        return await detail_page(request, me, approval_id, reveal=False, status=exc.status, error=exc.message)
    return redirect(f"{PREFIX}/approvals/{approval_id}")


@post("/approvals/{approval_id:str}/reject", include_in_schema=False, status_code=303)
async def reject(request: Request, approval_id: FromPath[str]) -> Response[Any]:
    me = await signed_in(request)
    fields = await checked_form(request, me.csrf_token)
    require(me, DECIDE)
    check_id(approval_id)
    reason = fields.get("reason", "").strip()
    if not reason or len(reason) > 1000:
        return await detail_page(request, me, approval_id, reveal=False, status=400,
                                 error="Give a reason for the rejection (at most 1000 characters).")
    approvals = services_of(request).approvals
    try:
        await approvals.reject(me.principal, approval_id, reason, request_id=request_id_of(request.scope))
    except GatewayError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise
        return await detail_page(request, me, approval_id, reveal=False, status=exc.status, error=exc.message)
    return redirect(f"{PREFIX}/approvals/{approval_id}")


def check_id(approval_id: str) -> None:
    """An id no approval can have is simply not found (the API's rule for path ids)."""
    if _ID.fullmatch(approval_id) is None:
        raise GatewayError(ErrorCode.NOT_FOUND, "No such approval.")


HANDLERS = [approvals_page, approval_page, reveal_arguments, approve, reject]
