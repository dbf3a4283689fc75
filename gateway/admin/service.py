"""Tenant administration: roles and their permissions, tool policies, and the tenant's caps.

Every change is one transaction that also appends its audit row (who, what, before and
after), under a lock on the tenant's row so that concurrent changes apply one after the
other and each audit row's ``before`` is what it replaced. This process sees a change at
once (its tenant cache entry is dropped); other gateway processes within
``GATEWAY_POLICY_CACHE_S`` seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.rows import AuditRow, append_audit
from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.db import policies as pq
from gateway.db import roles as rq
from gateway.db.engine import Database
from gateway.db.models import Tenant
from gateway.db.policies import DEFAULT_POLICY, ApprovalMode, ToolPolicy
from gateway.errors import ErrorCode, GatewayError
from gateway.tools.base import Tool
from gateway.tools.registry import ToolRegistry

log = structlog.get_logger("gateway.admin")

ROLES_MANAGE = "roles:manage"
TOOLS_MANAGE = "tools:manage"
TENANTS_MANAGE = "tenants:manage"
CAP_FIELDS = ("max_tool_calls_per_run", "max_repeats_per_call", "max_run_ttl_s")

tenants = Tenant.__table__


async def append_admin_audit(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    user_id: str | None,
    action: str,
    target: str,
    before: Any,
    after: Any,
    request_id: str | None,
    tool: str | None = None,
) -> None:
    """An administrative change, audited like a tool call: who, what, before and after."""
    await append_audit(
        conn,
        AuditRow(
            tenant_id=tenant_id,
            kind="admin_change",
            outcome="OK",
            created_at=datetime.now(UTC),
            user_id=user_id,
            tool=tool,
            request_id=request_id,
            detail={"action": action, "target": target, "before": before, "after": after},
        ),
    )


@dataclass(frozen=True, slots=True)
class ToolPolicyState:
    tool: Tool
    policy: ToolPolicy
    customised: bool


@dataclass(frozen=True, slots=True)
class TenantState:
    id: str
    name: str
    disabled: bool
    caps: dict[str, int]
    llm_provider: str | None = None
    allow_client_tools: bool = False


def bypasses_approval(tool: Tool, policy: ToolPolicy) -> bool:
    """Whether ``policy`` lets calls of ``tool``, which changes data, run without an approval.

    That is the operator's decision (``gateway tenants approval-mode``), never a tenant
    administrator's: ``tools:manage`` may keep it (change other fields of such a policy) or
    take it back, not grant it.
    """
    return tool.mutates and policy.approval_mode is ApprovalMode.NEVER and policy.approval_waived


def carried_waiver(policy: ToolPolicy, before: ToolPolicy | None) -> ToolPolicy:
    """A tenant administrator's policy, keeping the operator's waiver while it stays ``never``."""
    kept = (policy.approval_mode is ApprovalMode.NEVER and before is not None
            and before.approval_mode is ApprovalMode.NEVER and before.approval_waived)
    return replace(policy, approval_waived=kept)


def _not_found(what: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, f"No such {what}.")


class TenantAdmin:
    def __init__(self, *, db: Database, registry: ToolRegistry, directory: TenantDirectory) -> None:
        self._db = db
        self._registry = registry
        self._directory = directory

    # -- roles ---------------------------------------------------------------------------

    async def list_roles(self, principal: Principal) -> list[rq.RoleRecord]:
        async with self._db.connect() as conn:
            return await rq.list_roles(conn, tenant_id=principal.tenant_id)

    async def get_role(self, principal: Principal, name: str) -> rq.RoleRecord:
        async with self._db.connect() as conn:
            role = await rq.get_role(conn, tenant_id=principal.tenant_id, name=name)
        if role is None:
            raise _not_found("role")
        return role

    async def create_role(
        self, principal: Principal, *, name: str, description: str, permissions: list[str], request_id: str | None
    ) -> rq.RoleRecord:
        async with self._change(principal) as conn:
            if await rq.get_role(conn, tenant_id=principal.tenant_id, name=name) is not None:
                raise GatewayError(ErrorCode.CONFLICT, f"A role named {name!r} already exists.")
            await rq.create_role(
                conn, tenant_id=principal.tenant_id, name=name, description=description, permissions=permissions
            )
            after = await rq.get_role(conn, tenant_id=principal.tenant_id, name=name)
            assert after is not None
            await self._audit(conn, principal, "role.create", f"role:{name}", None, after.as_dict(), request_id)
        self._changed(principal, "role.create", name)
        return after

    async def replace_role(
        self,
        principal: Principal,
        name: str,
        *,
        description: str | None,
        permissions: list[str],
        request_id: str | None,
    ) -> rq.RoleRecord:
        async with self._change(principal) as conn:
            before = await rq.get_role(conn, tenant_id=principal.tenant_id, name=name)
            if before is None:
                raise _not_found("role")
            await rq.replace_role(
                conn,
                tenant_id=principal.tenant_id,
                name=name,
                description=before.description if description is None else description,
                permissions=permissions,
            )
            await self._refuse_lockout(conn, principal)
            after = await rq.get_role(conn, tenant_id=principal.tenant_id, name=name)
            assert after is not None
            await self._audit(
                conn, principal, "role.update", f"role:{name}", before.as_dict(), after.as_dict(), request_id
            )
        self._changed(principal, "role.update", name)
        return after

    async def delete_role(self, principal: Principal, name: str, *, request_id: str | None) -> None:
        async with self._change(principal) as conn:
            before = await rq.get_role(conn, tenant_id=principal.tenant_id, name=name)
            if before is None:
                raise _not_found("role")
            await rq.delete_role(conn, tenant_id=principal.tenant_id, name=name)
            await self._refuse_lockout(conn, principal)
            await self._audit(conn, principal, "role.delete", f"role:{name}", before.as_dict(), None, request_id)
        self._changed(principal, "role.delete", name)

    async def _refuse_lockout(self, conn: AsyncConnection, principal: Principal) -> None:
        """An administrator cannot take ``roles:manage`` away from their own roles (nobody could give it back)."""
        left = await rq.permissions_of(conn, tenant_id=principal.tenant_id, role_names=principal.roles)
        if ROLES_MANAGE not in left:
            raise GatewayError(
                ErrorCode.CONFLICT, f"This change would take {ROLES_MANAGE!r} away from your own roles."
            )

    # -- tool policies -------------------------------------------------------------------

    def _tool(self, name: str) -> Tool:
        tool = self._registry.get(name)
        if tool is None:
            raise _not_found("tool")
        return tool

    async def list_tool_policies(self, principal: Principal) -> list[ToolPolicyState]:
        async with self._db.connect() as conn:
            stored = await pq.load_policies(conn, tenant_id=principal.tenant_id)
        return [ToolPolicyState(tool, stored.for_tool(tool.name), tool.name in stored) for tool in self._registry]

    async def get_tool_policy(self, principal: Principal, name: str) -> ToolPolicyState:
        tool = self._tool(name)
        async with self._db.connect() as conn:
            policy = await pq.get_policy(conn, tenant_id=principal.tenant_id, tool=name)
        return ToolPolicyState(tool, policy or DEFAULT_POLICY, policy is not None)

    async def put_tool_policy(
        self, principal: Principal, name: str, policy: ToolPolicy, *, request_id: str | None
    ) -> ToolPolicyState:
        tool = self._tool(name)
        async with self._change(principal) as conn:
            before = await pq.get_policy(conn, tenant_id=principal.tenant_id, tool=name)
            policy = carried_waiver(policy, before)
            kept_never = before is not None and before.approval_mode is ApprovalMode.NEVER
            # Granting never is refused; keeping one set while the tool read only is allowed
            # (it counts as mutating without the waiver), so its other fields stay editable.
            if tool.mutates and policy.approval_mode is ApprovalMode.NEVER and not policy.approval_waived \
                    and not kept_never:
                raise GatewayError(
                    ErrorCode.FORBIDDEN,
                    f"Only the operator can let a tool that changes data run without approval "
                    f"(`gateway tenants approval-mode {principal.tenant_id} {name} never`).",
                )
            await pq.put_policy(
                conn, tenant_id=principal.tenant_id, tool=name, policy=policy, updated_by=principal.user_id,
                now=datetime.now(UTC),
            )
            await self._audit(
                conn, principal, "tool_policy.update", f"tool:{name}", (before or DEFAULT_POLICY).as_dict(),
                policy.as_dict(), request_id, tool=name,
            )
        self._changed(principal, "tool_policy.update", name)
        return ToolPolicyState(tool, policy, True)

    async def reset_tool_policy(self, principal: Principal, name: str, *, request_id: str | None) -> ToolPolicyState:
        tool = self._tool(name)
        async with self._change(principal) as conn:
            before = await pq.get_policy(conn, tenant_id=principal.tenant_id, tool=name)
            if before is not None:
                await pq.delete_policy(conn, tenant_id=principal.tenant_id, tool=name)
                await self._audit(
                    conn, principal, "tool_policy.reset", f"tool:{name}", before.as_dict(),
                    DEFAULT_POLICY.as_dict(), request_id, tool=name,
                )
        self._changed(principal, "tool_policy.reset", name)
        return ToolPolicyState(tool, DEFAULT_POLICY, False)

    # -- the tenant's caps ---------------------------------------------------------------

    async def get_tenant(self, principal: Principal) -> TenantState:
        async with self._db.connect() as conn:
            return await self._tenant(conn, principal.tenant_id)

    async def update_caps(
        self, principal: Principal, caps: dict[str, int], *, request_id: str | None
    ) -> TenantState:
        async with self._change(principal) as conn:
            before = await self._tenant(conn, principal.tenant_id)
            if caps:
                await conn.execute(sa.update(tenants).where(tenants.c.id == principal.tenant_id).values(**caps))
            after = await self._tenant(conn, principal.tenant_id)
            if caps:
                await self._audit(conn, principal, "tenant.caps", f"tenant:{principal.tenant_id}", before.caps,
                                  after.caps, request_id)
        self._changed(principal, "tenant.caps", principal.tenant_id)
        return after

    @staticmethod
    async def _tenant(conn: AsyncConnection, tenant_id: str) -> TenantState:
        row = (await conn.execute(sa.select(tenants).where(tenants.c.id == tenant_id))).first()
        if row is None:
            raise _not_found("tenant")
        return TenantState(
            id=row.id, name=row.name, disabled=row.disabled, caps={name: getattr(row, name) for name in CAP_FIELDS},
            llm_provider=row.llm_provider, allow_client_tools=bool(row.allow_client_tools),
        )

    # -- shared --------------------------------------------------------------------------

    @asynccontextmanager
    async def _change(self, principal: Principal) -> AsyncIterator[AsyncConnection]:
        """One administrative change: a transaction holding the tenant's row lock."""
        async with self._db.begin() as conn:
            if not await rq.lock_tenant(conn, tenant_id=principal.tenant_id):
                raise _not_found("tenant")
            yield conn

    @staticmethod
    async def _audit(
        conn: AsyncConnection, principal: Principal, action: str, target: str, before: Any, after: Any,
        request_id: str | None, *, tool: str | None = None,
    ) -> None:
        await append_admin_audit(
            conn, tenant_id=principal.tenant_id, user_id=principal.user_id, action=action, target=target,
            before=before, after=after, request_id=request_id, tool=tool,
        )

    def _changed(self, principal: Principal, action: str, target: str) -> None:
        self._directory.invalidate(principal.tenant_id)
        log.info("admin_change", action=action, target=target)
