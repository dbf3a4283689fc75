"""Queries for tenants, roles and users."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import Role, RolePermission, Tenant, User
from gateway.db.policies import NO_POLICIES, TenantPolicies, load_policies
from gateway.db.types import utcnow


@dataclass(frozen=True, slots=True)
class TenantRecord:
    id: str
    name: str
    disabled: bool
    max_tool_calls_per_run: int
    max_repeats_per_call: int
    max_run_ttl_s: int
    role_permissions: dict[str, frozenset[str]]
    tool_policies: TenantPolicies = field(default=NO_POLICIES)
    allow_client_tools: bool = False
    """The agent loop passes a request's own ``tools`` through to the model."""
    llm_provider: str | None = None
    """The model provider the tenant's agent runs are pinned to."""


async def load_tenant(conn: AsyncConnection, *, tenant_id: str) -> TenantRecord | None:
    row = (await conn.execute(sa.select(Tenant.__table__).where(Tenant.id == tenant_id))).mappings().first()
    if row is None:
        return None
    grants: dict[str, set[str]] = {}
    roles = await conn.execute(sa.select(Role.name).where(Role.tenant_id == tenant_id))
    for (name,) in roles:
        grants[name] = set()
    perms = await conn.execute(
        sa.select(RolePermission.role, RolePermission.permission).where(RolePermission.tenant_id == tenant_id)
    )
    for role, permission in perms:
        grants.setdefault(role, set()).add(permission)
    return TenantRecord(
        id=row["id"],
        name=row["name"],
        disabled=row["disabled"],
        max_tool_calls_per_run=row["max_tool_calls_per_run"],
        max_repeats_per_call=row["max_repeats_per_call"],
        max_run_ttl_s=row["max_run_ttl_s"],
        role_permissions={role: frozenset(p) for role, p in grants.items()},
        tool_policies=await load_policies(conn, tenant_id=tenant_id),
        allow_client_tools=row["allow_client_tools"],
        llm_provider=row["llm_provider"],
    )


async def set_agent_settings(
    conn: AsyncConnection, *, tenant_id: str, allow_client_tools: bool, llm_provider: str | None
) -> bool:
    """Set the tenant's agent-loop settings; False when there is no such tenant."""
    result = await conn.execute(
        sa.update(Tenant)
        .where(Tenant.id == tenant_id)
        .values(allow_client_tools=allow_client_tools, llm_provider=llm_provider)
    )
    return result.rowcount == 1


async def create_tenant(conn: AsyncConnection, *, tenant_id: str, name: str) -> bool:
    """Create the tenant unless it exists; True when it was created."""
    exists = await conn.scalar(sa.select(sa.func.count()).select_from(Tenant).where(Tenant.id == tenant_id))
    if exists:
        return False
    await conn.execute(sa.insert(Tenant).values(id=tenant_id, name=name, created_at=utcnow()))
    return True


async def ensure_role(
    conn: AsyncConnection, *, tenant_id: str, name: str, description: str, permissions: frozenset[str]
) -> None:
    """Create the role if missing and make sure it grants at least ``permissions``."""
    exists = await conn.scalar(
        sa.select(sa.func.count()).select_from(Role).where(Role.tenant_id == tenant_id, Role.name == name)
    )
    if not exists:
        await conn.execute(
            sa.insert(Role).values(tenant_id=tenant_id, name=name, description=description, created_at=utcnow())
        )
    have = set(
        (
            await conn.execute(
                sa.select(RolePermission.permission).where(
                    RolePermission.tenant_id == tenant_id, RolePermission.role == name
                )
            )
        ).scalars()
    )
    missing = sorted(permissions - have)
    if missing:
        await conn.execute(
            sa.insert(RolePermission),
            [{"tenant_id": tenant_id, "role": name, "permission": p} for p in missing],
        )


async def ensure_user(
    conn: AsyncConnection, *, tenant_id: str, user_id: str, display_name: str, roles: list[str]
) -> None:
    exists = await conn.scalar(
        sa.select(sa.func.count()).select_from(User).where(User.tenant_id == tenant_id, User.id == user_id)
    )
    if not exists:
        await conn.execute(
            sa.insert(User).values(
                tenant_id=tenant_id, id=user_id, display_name=display_name, roles=roles, created_at=utcnow()
            )
        )


async def user_roles(conn: AsyncConnection, *, tenant_id: str, user_id: str) -> list[str] | None:
    return await conn.scalar(sa.select(User.roles).where(User.tenant_id == tenant_id, User.id == user_id))
