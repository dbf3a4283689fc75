"""Tenant-scoped queries for roles and the permissions they grant."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import Role, RolePermission, Tenant
from gateway.db.types import utcnow

roles = Role.__table__
role_permissions = RolePermission.__table__
tenants = Tenant.__table__


@dataclass(frozen=True, slots=True)
class RoleRecord:
    name: str
    description: str
    permissions: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "permissions": list(self.permissions)}


async def lock_tenant(conn: AsyncConnection, *, tenant_id: str) -> bool:
    """Serialise a tenant's administrative changes (the tenant's row lock); False when there
    is no such tenant."""
    found = await conn.scalar(sa.select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update())
    return found is not None


async def list_roles(conn: AsyncConnection, *, tenant_id: str) -> list[RoleRecord]:
    grants: dict[str, list[str]] = {}
    for role, permission in await conn.execute(
        sa.select(role_permissions.c.role, role_permissions.c.permission)
        .where(role_permissions.c.tenant_id == tenant_id)
        .order_by(role_permissions.c.role, role_permissions.c.permission)
    ):
        grants.setdefault(role, []).append(permission)
    rows = await conn.execute(
        sa.select(roles.c.name, roles.c.description).where(roles.c.tenant_id == tenant_id).order_by(roles.c.name)
    )
    return [RoleRecord(name, description, tuple(grants.get(name, ()))) for name, description in rows]


async def get_role(conn: AsyncConnection, *, tenant_id: str, name: str) -> RoleRecord | None:
    row = (
        await conn.execute(
            sa.select(roles.c.name, roles.c.description).where(roles.c.tenant_id == tenant_id, roles.c.name == name)
        )
    ).first()
    if row is None:
        return None
    granted = await conn.execute(
        sa.select(role_permissions.c.permission)
        .where(role_permissions.c.tenant_id == tenant_id, role_permissions.c.role == name)
        .order_by(role_permissions.c.permission)
    )
    return RoleRecord(row.name, row.description, tuple(granted.scalars()))


async def create_role(
    conn: AsyncConnection, *, tenant_id: str, name: str, description: str, permissions: list[str]
) -> None:
    await conn.execute(
        sa.insert(roles).values(tenant_id=tenant_id, name=name, description=description, created_at=utcnow())
    )
    await _grant(conn, tenant_id=tenant_id, name=name, permissions=permissions)


async def replace_role(
    conn: AsyncConnection, *, tenant_id: str, name: str, description: str, permissions: list[str]
) -> None:
    await conn.execute(
        sa.update(roles).where(roles.c.tenant_id == tenant_id, roles.c.name == name).values(description=description)
    )
    await conn.execute(
        sa.delete(role_permissions).where(role_permissions.c.tenant_id == tenant_id, role_permissions.c.role == name)
    )
    await _grant(conn, tenant_id=tenant_id, name=name, permissions=permissions)


async def delete_role(conn: AsyncConnection, *, tenant_id: str, name: str) -> None:
    await conn.execute(
        sa.delete(role_permissions).where(role_permissions.c.tenant_id == tenant_id, role_permissions.c.role == name)
    )
    await conn.execute(sa.delete(roles).where(roles.c.tenant_id == tenant_id, roles.c.name == name))


async def permissions_of(conn: AsyncConnection, *, tenant_id: str, role_names: frozenset[str]) -> frozenset[str]:
    if not role_names:
        return frozenset()
    granted = await conn.execute(
        sa.select(role_permissions.c.permission).where(
            role_permissions.c.tenant_id == tenant_id, role_permissions.c.role.in_(sorted(role_names))
        )
    )
    return frozenset(granted.scalars())


async def _grant(conn: AsyncConnection, *, tenant_id: str, name: str, permissions: list[str]) -> None:
    unique = sorted(set(permissions))
    if unique:
        await conn.execute(
            sa.insert(role_permissions),
            [{"tenant_id": tenant_id, "role": name, "permission": p} for p in unique],
        )
