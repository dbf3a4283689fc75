"""The tenant page: roles with their permissions and the tools' policies, changed through
``TenantAdmin`` (the admin API's service: the same checks, the same ``admin_change`` audit
rows), by users whose permissions allow it."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import FromPath

from gateway.admin.service import ROLES_MANAGE, TOOLS_MANAGE
from gateway.api.admin import RoleUpdate, ToolPolicyIn, policy_view
from gateway.api.context import request_id_of
from gateway.api.params import NAME_PATTERN
from gateway.console.approvals import nav_count
from gateway.console.web import PREFIX, SignedIn, checked_form, page, redirect, services_of, signed_in
from gateway.db.policies import ApprovalMode, ToolPolicy
from gateway.errors import ErrorCode, GatewayError


_NAME = re.compile(NAME_PATTERN)


def check_name(name: str, what: str) -> None:
    """A name no role or tool can have is simply not found (the admin API's rule for names)."""
    if _NAME.fullmatch(name) is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No such {what}.")


def may_see(me: SignedIn) -> None:
    if not (me.principal.has(ROLES_MANAGE) or me.principal.has(TOOLS_MANAGE)):
        raise GatewayError(ErrorCode.FORBIDDEN, f"This page needs the permission “{ROLES_MANAGE}” or "
                           f"“{TOOLS_MANAGE}”, which your roles do not give you.")


def require(me: SignedIn, permission: str) -> None:
    if not me.principal.has(permission):
        raise GatewayError(ErrorCode.FORBIDDEN, f"This change needs the permission “{permission}”.")


async def tenant_page_for(request: Request[Any, Any, Any], me: SignedIn, *, status: int = 200,
                          error: str | None = None, done: str | None = None) -> Response[str]:
    admin = services_of(request).tenant_admin
    roles = await admin.list_roles(me.principal) if me.principal.has(ROLES_MANAGE) else None
    tools = ([policy_view(state) for state in await admin.list_tool_policies(me.principal)]
             if me.principal.has(TOOLS_MANAGE) else None)
    return page("tenant.html", status=status, me=me, pending=await nav_count(request, me), section="tenant",
                roles=roles, tools=tools, error=error, done=done, approval_modes=[mode.value for mode in ApprovalMode])


@get("/tenant", include_in_schema=False)
async def tenant_page(request: Request) -> Response[str]:
    me = await signed_in(request)
    may_see(me)
    return await tenant_page_for(request, me)


@post("/tenant/roles/{name:str}", include_in_schema=False, status_code=303)
async def change_role(request: Request, name: FromPath[str]) -> Response[Any]:
    me = await signed_in(request)
    fields = await checked_form(request, me.csrf_token)
    require(me, ROLES_MANAGE)
    check_name(name, "role")
    permissions = sorted(set(fields.get("permissions", "").replace(",", " ").split()))
    try:
        update = msgspec.convert({"permissions": permissions}, RoleUpdate)
    except msgspec.ValidationError:
        return await tenant_page_for(request, me, status=400, error="A permission is not valid: use names such as "
                                     "approvals:decide, separated by spaces or new lines.")
    try:
        await services_of(request).tenant_admin.replace_role(
            me.principal, name, description=None, permissions=update.permissions,
            request_id=request_id_of(request.scope),
        )
    except GatewayError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise
        return await tenant_page_for(request, me, status=exc.status, error=exc.message)
    return redirect(f"{PREFIX}/tenant")


@post("/tenant/tools/{tool:str}", include_in_schema=False, status_code=303)
async def change_tool_policy(request: Request, tool: FromPath[str]) -> Response[Any]:
    """Whether the tool is on and when it needs approval; its other limits are kept as they are."""
    me = await signed_in(request)
    fields = await checked_form(request, me.csrf_token)
    require(me, TOOLS_MANAGE)
    check_name(tool, "tool")
    admin = services_of(request).tenant_admin
    current = (await admin.get_tool_policy(me.principal, tool)).policy.as_dict()
    wanted = {**current, "enabled": fields.get("enabled") == "on",
              "approval_mode": fields.get("approval_mode", current["approval_mode"])}
    try:
        data = msgspec.convert(wanted, ToolPolicyIn)
    except msgspec.ValidationError:
        return await tenant_page_for(request, me, status=400, error="Choose an approval mode from the list.")
    policy = ToolPolicy(
        enabled=data.enabled,
        approval_mode=ApprovalMode(data.approval_mode),
        timeout_s=data.timeout_s,
        max_calls_per_run=data.max_calls_per_run,
        max_result_bytes=data.max_result_bytes,
        allowed_roles=frozenset(data.allowed_roles) if data.allowed_roles is not None else None,
    )
    try:
        await admin.put_tool_policy(me.principal, tool, policy, request_id=request_id_of(request.scope))
    except GatewayError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise
        return await tenant_page_for(request, me, status=exc.status, error=exc.message)
    return redirect(f"{PREFIX}/tenant")


HANDLERS = [tenant_page, change_role, change_tool_policy]
