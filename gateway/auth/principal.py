"""Who is calling: built only from a verified token, then passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.db.policies import NO_POLICIES, TenantPolicies


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str
    user_id: str
    roles: frozenset[str]
    permissions: frozenset[str]
    tool_policies: TenantPolicies = field(default=NO_POLICIES, compare=False)
    """The tenant's tool policies as cached with its roles (what the caller may see and how calls run)."""

    def has(self, permission: str) -> bool:
        return permission in self.permissions
