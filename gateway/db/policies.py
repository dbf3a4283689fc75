"""Tool policies: what a tenant's administrators decide about each tool, and their queries.

A tool without a row has the default policy (enabled, approval for tools that change
data, the tool's own timeout and result size, no per-run cap, every role that holds the
tool's permission). Policies are read with the tenant into the ``TenantDirectory`` cache
and travel with the caller's ``Principal``; they are never queried per call.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import ToolPolicyRow

tool_policies = ToolPolicyRow.__table__


class ApprovalMode(enum.StrEnum):
    NEVER = "never"
    """Calls run at once, also those of tools that change data."""
    MUTATING = "mutating"
    """Calls of tools that change data wait for an administrator's approval (the default)."""
    ALWAYS = "always"
    """Every call waits for an administrator's approval."""


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    enabled: bool = True
    approval_mode: ApprovalMode = ApprovalMode.MUTATING
    timeout_s: float | None = None
    max_calls_per_run: int | None = None
    max_result_bytes: int | None = None
    allowed_roles: frozenset[str] | None = None
    """``None``: every role that holds the tool's permission; else only these roles (it narrows, never widens)."""
    approval_waived: bool = False
    """The operator let calls run without approval though the tool changes data (``gateway
    tenants approval-mode ... never``). ``never`` without it is ``mutating`` for a tool that
    changes data: a tenant administrator's ``never`` on a tool that reads only must not become
    a waiver when the tool later changes data (an MCP server's hint, a tools file). Not in
    ``as_dict``, which is what a tenant administrator sets."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "approval_mode": self.approval_mode.value,
            "timeout_s": self.timeout_s,
            "max_calls_per_run": self.max_calls_per_run,
            "max_result_bytes": self.max_result_bytes,
            "allowed_roles": sorted(self.allowed_roles) if self.allowed_roles is not None else None,
        }


DEFAULT_POLICY = ToolPolicy()


class TenantPolicies(Mapping[str, ToolPolicy]):
    """A tenant's policies by tool name, as loaded at one moment (immutable)."""

    __slots__ = ("_policies",)

    def __init__(self, policies: Mapping[str, ToolPolicy] | None = None) -> None:
        self._policies: dict[str, ToolPolicy] = dict(policies or {})

    def __getitem__(self, name: str) -> ToolPolicy:
        return self._policies[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._policies)

    def __len__(self) -> int:
        return len(self._policies)

    def for_tool(self, name: str) -> ToolPolicy:
        return self._policies.get(name, DEFAULT_POLICY)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


NO_POLICIES = TenantPolicies()


def policy_from_row(row: Any) -> ToolPolicy:
    return ToolPolicy(
        enabled=bool(row.enabled),
        approval_mode=ApprovalMode(row.approval_mode),
        timeout_s=row.timeout_s,
        max_calls_per_run=row.max_calls_per_run,
        max_result_bytes=row.max_result_bytes,
        allowed_roles=frozenset(row.allowed_roles) if row.allowed_roles is not None else None,
        approval_waived=bool(row.approval_waived),
    )


async def load_policies(conn: AsyncConnection, *, tenant_id: str) -> TenantPolicies:
    rows = await conn.execute(sa.select(tool_policies).where(tool_policies.c.tenant_id == tenant_id))
    return TenantPolicies({row.tool: policy_from_row(row) for row in rows})


async def get_policy(conn: AsyncConnection, *, tenant_id: str, tool: str) -> ToolPolicy | None:
    row = (
        await conn.execute(
            sa.select(tool_policies).where(tool_policies.c.tenant_id == tenant_id, tool_policies.c.tool == tool)
        )
    ).first()
    return policy_from_row(row) if row is not None else None


async def put_policy(
    conn: AsyncConnection, *, tenant_id: str, tool: str, policy: ToolPolicy, updated_by: str, now: datetime
) -> None:
    """Replace the tool's policy (delete then insert: the same on both backends)."""
    await delete_policy(conn, tenant_id=tenant_id, tool=tool)
    values = policy.as_dict()
    await conn.execute(
        sa.insert(tool_policies).values(
            tenant_id=tenant_id, tool=tool, updated_by=updated_by, updated_at=now,
            approval_waived=policy.approval_waived, **values
        )
    )


async def delete_policy(conn: AsyncConnection, *, tenant_id: str, tool: str) -> bool:
    result = await conn.execute(
        sa.delete(tool_policies).where(tool_policies.c.tenant_id == tenant_id, tool_policies.c.tool == tool)
    )
    return result.rowcount == 1
