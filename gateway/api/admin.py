"""Tenant administration API: roles → permissions, tool policies, the tenant's caps.

Each route needs its permission (``roles:manage``, ``tools:manage``, ``tenants:manage``)
and acts on the caller's tenant only: another tenant's roles are simply not found.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from litestar import Controller, Request, delete, get, patch, post, put
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.admin.service import (
    ROLES_MANAGE,
    TENANTS_MANAGE,
    TOOLS_MANAGE,
    TenantAdmin,
    TenantState,
    ToolPolicyState,
)
from gateway.api.params import Name
from gateway.api.context import request_id_of
from gateway.api.dependencies import principal_of
from gateway.api.openapi import error_responses
from gateway.api.schemas import Input
from gateway.auth.guards import requires_permission
from gateway.db.policies import ApprovalMode, ToolPolicy
from gateway.db.roles import RoleRecord
from gateway.execution.policy import MAX_POLICY_TIMEOUT_S, tool_limits
from gateway.text import refuse_line_breaks

RoleName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="A role's name.")]
Permission = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[a-z][a-z0-9_.-]{0,62}:[a-z0-9_.*-]{1,63}$",
        description="A permission, `area:action` (e.g. `articles:read`).",
    ),
]


class RoleCreate(Input, kw_only=True, forbid_unknown_fields=True):
    name: RoleName
    description: Annotated[str, msgspec.Meta(max_length=500)] = ""
    permissions: Annotated[list[Permission], msgspec.Meta(max_length=200)]

    def __post_init__(self) -> None:
        refuse_line_breaks(name=self.name, permissions=self.permissions)


class RoleUpdate(Input, kw_only=True, forbid_unknown_fields=True):
    """Replaces the role's permissions (and its description, when given)."""

    description: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    permissions: Annotated[list[Permission], msgspec.Meta(max_length=200)]

    def __post_init__(self) -> None:
        refuse_line_breaks(permissions=self.permissions)


class RoleView(msgspec.Struct):
    name: str
    description: str
    permissions: list[str]


class RoleList(msgspec.Struct):
    items: list[RoleView]


class ToolPolicyIn(Input, kw_only=True, forbid_unknown_fields=True):
    """The whole policy: a field left out takes its default."""

    enabled: bool = True
    approval_mode: Literal["never", "mutating", "always"] = "mutating"
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_POLICY_TIMEOUT_S)] | None = None
    max_calls_per_run: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    max_result_bytes: Annotated[int, msgspec.Meta(ge=64, le=10_485_760)] | None = None
    allowed_roles: Annotated[list[RoleName], msgspec.Meta(max_length=200)] | None = None
    approval_waived: bool | None = None
    """Read only, and ignored here: the operator's waiver (`gateway tenants approval-mode`),
    accepted so that a policy read with `GET` can be written back as it came."""

    def __post_init__(self) -> None:
        refuse_line_breaks(allowed_roles=self.allowed_roles)


class ToolPolicyOut(msgspec.Struct):
    enabled: bool
    approval_mode: str
    timeout_s: float | None
    max_calls_per_run: int | None
    max_result_bytes: int | None
    allowed_roles: list[str] | None
    approval_waived: bool = False
    """The operator let this tool's calls run without approval though it changes data
    (`gateway tenants approval-mode ... never`). For such a tool `approval_mode: never`
    without it counts as `mutating`; only the operator sets it, and a tenant administrator's
    change keeps it while `approval_mode` stays `never`."""


class ToolPolicyView(msgspec.Struct):
    tool: str
    permission: str
    mutates: bool
    customised: bool
    """False: the tool has the default policy."""
    policy: ToolPolicyOut
    effective_timeout_s: float | None
    effective_max_result_bytes: int | None


class ToolPolicyList(msgspec.Struct):
    items: list[ToolPolicyView]


class TenantCapsIn(Input, kw_only=True, forbid_unknown_fields=True):
    """Caps on the limits of the tenant's new runs; a field left out is unchanged."""

    max_tool_calls_per_run: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    max_repeats_per_call: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    max_run_ttl_s: Annotated[int, msgspec.Meta(ge=60, le=31_536_000)] | None = None


class TenantCaps(msgspec.Struct):
    max_tool_calls_per_run: int
    max_repeats_per_call: int
    max_run_ttl_s: int


class TenantAgentLoop(msgspec.Struct):
    """The agent loop's settings for the tenant; the operator sets them (`gateway tenants
    configure`), the tenant's administrators can read them here."""

    llm_provider: str | None
    """The model provider the tenant's conversations are pinned to; null: the gateway's default."""
    allow_client_tools: bool
    """Whether a chat request may bring tools of its own."""


class TenantView(msgspec.Struct):
    id: str
    name: str
    disabled: bool
    caps: TenantCaps
    agent_loop: TenantAgentLoop


def role_view(role: RoleRecord) -> RoleView:
    return RoleView(name=role.name, description=role.description, permissions=list(role.permissions))


def policy_view(state: ToolPolicyState) -> ToolPolicyView:
    policy, tool = state.policy, state.tool
    effective = tool_limits(tool, policy)
    return ToolPolicyView(
        tool=tool.name,
        permission=tool.permission,
        mutates=tool.mutates,
        customised=state.customised,
        policy=msgspec.convert({**policy.as_dict(), "approval_waived": policy.approval_waived}, ToolPolicyOut),
        effective_timeout_s=effective.timeout_s,
        effective_max_result_bytes=effective.max_result_bytes,
    )


def tenant_view(state: TenantState) -> TenantView:
    return TenantView(
        id=state.id, name=state.name, disabled=state.disabled, caps=TenantCaps(**state.caps),
        agent_loop=TenantAgentLoop(llm_provider=state.llm_provider, allow_client_tools=state.allow_client_tools),
    )


class RoleAdminController(Controller):
    path = "/v1/admin/roles"
    tags = ["admin"]
    guards = [requires_permission(ROLES_MANAGE)]

    @get("/", summary="List the tenant's roles", responses=error_responses(401, 403, 503))
    async def list_roles(self, request: Request, tenant_admin: NamedDependency[TenantAdmin]) -> RoleList:
        """Every role with the permissions it grants, sorted by name."""
        return RoleList(items=[role_view(r) for r in await tenant_admin.list_roles(principal_of(request))])

    @post("/", status_code=201, summary="Create a role", responses=error_responses(400, 401, 403, 409, 503))
    async def create_role(
        self, request: Request, tenant_admin: NamedDependency[TenantAdmin], data: JSONBody[RoleCreate]
    ) -> RoleView:
        """A new role and the permissions it grants; `409 CONFLICT` when the name is taken."""
        role = await tenant_admin.create_role(
            principal_of(request), name=data.name, description=data.description, permissions=data.permissions,
            request_id=request_id_of(request.scope),
        )
        return role_view(role)

    @get("/{name:str}", summary="Read a role", responses=error_responses(400, 401, 403, 404, 503))
    async def get_role(self, request: Request, tenant_admin: NamedDependency[TenantAdmin], name: Name) -> RoleView:
        """A role of the caller's tenant (another tenant's is not found)."""
        return role_view(await tenant_admin.get_role(principal_of(request), name))

    @put("/{name:str}", summary="Change a role", responses=error_responses(400, 401, 403, 404, 409, 503))
    async def replace_role(
        self, request: Request, tenant_admin: NamedDependency[TenantAdmin], name: Name, data: JSONBody[RoleUpdate]
    ) -> RoleView:
        """Replaces its permissions (and description, when given). A change that would take
        `roles:manage` away from the caller's own roles is `409 CONFLICT`."""
        role = await tenant_admin.replace_role(
            principal_of(request), name, description=data.description, permissions=data.permissions,
            request_id=request_id_of(request.scope),
        )
        return role_view(role)

    @delete("/{name:str}", status_code=204, summary="Delete a role", responses=error_responses(400, 401, 403, 404, 409, 503))
    async def delete_role(self, request: Request, tenant_admin: NamedDependency[TenantAdmin], name: Name) -> None:
        """Tokens naming the role keep working but it grants nothing any more."""
        await tenant_admin.delete_role(principal_of(request), name, request_id=request_id_of(request.scope))


class ToolPolicyAdminController(Controller):
    path = "/v1/admin/tools"
    tags = ["admin"]
    guards = [requires_permission(TOOLS_MANAGE)]

    @get("/", summary="List every tool with the tenant's policy", responses=error_responses(401, 403, 503))
    async def list_policies(self, request: Request, tenant_admin: NamedDependency[TenantAdmin]) -> ToolPolicyList:
        """Every tool the gateway has, disabled ones included, with the policy in force."""
        return ToolPolicyList(items=[policy_view(s) for s in await tenant_admin.list_tool_policies(principal_of(request))])

    @get("/{tool:str}", summary="Read a tool's policy", responses=error_responses(400, 401, 403, 404, 503))
    async def get_policy(
        self, request: Request, tenant_admin: NamedDependency[TenantAdmin], tool: Name
    ) -> ToolPolicyView:
        """The tenant's policy for one tool (the default when none was set)."""
        return policy_view(await tenant_admin.get_tool_policy(principal_of(request), tool))

    @put("/{tool:str}", summary="Set a tool's policy", responses=error_responses(400, 401, 403, 404, 503))
    async def put_policy(
        self, request: Request, tenant_admin: NamedDependency[TenantAdmin], tool: Name, data: JSONBody[ToolPolicyIn]
    ) -> ToolPolicyView:
        """Replaces the tool's policy; `GET /v1/tools` and execution follow it at once.
        `approval_mode: never` on a tool that changes data is the operator's to grant
        (`gateway tenants approval-mode`): `403 FORBIDDEN` unless the policy already has it."""
        policy = ToolPolicy(
            enabled=data.enabled,
            approval_mode=ApprovalMode(data.approval_mode),
            timeout_s=data.timeout_s,
            max_calls_per_run=data.max_calls_per_run,
            max_result_bytes=data.max_result_bytes,
            allowed_roles=frozenset(data.allowed_roles) if data.allowed_roles is not None else None,
        )
        state = await tenant_admin.put_tool_policy(
            principal_of(request), tool, policy, request_id=request_id_of(request.scope)
        )
        return policy_view(state)

    @delete("/{tool:str}", status_code=200, summary="Reset a tool's policy", responses=error_responses(400, 401, 403, 404, 503))
    async def reset_policy(
        self, request: Request, tenant_admin: NamedDependency[TenantAdmin], tool: Name
    ) -> ToolPolicyView:
        """Back to the default policy."""
        return policy_view(
            await tenant_admin.reset_tool_policy(principal_of(request), tool, request_id=request_id_of(request.scope))
        )


class TenantAdminController(Controller):
    path = "/v1/admin/tenant"
    tags = ["admin"]
    guards = [requires_permission(TENANTS_MANAGE)]

    @get("/", summary="Read the tenant and its caps", responses=error_responses(401, 403, 503))
    async def get_tenant(self, request: Request, tenant_admin: NamedDependency[TenantAdmin]) -> TenantView:
        """The caller's tenant: name, state and the caps on its runs' limits."""
        return tenant_view(await tenant_admin.get_tenant(principal_of(request)))

    @patch("/", summary="Change the tenant's caps", responses=error_responses(400, 401, 403, 503))
    async def update_caps(
        self, request: Request, tenant_admin: NamedDependency[TenantAdmin], data: JSONBody[TenantCapsIn]
    ) -> TenantView:
        """Caps apply to runs created from now on (new runs' limits are clamped by them)."""
        caps = {name: getattr(data, name) for name in TenantCapsIn.__struct_fields__ if getattr(data, name) is not None}
        return tenant_view(
            await tenant_admin.update_caps(principal_of(request), caps, request_id=request_id_of(request.scope))
        )
