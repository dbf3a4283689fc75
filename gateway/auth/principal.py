"""Who is calling: built only from a verified token, then passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str
    user_id: str
    roles: frozenset[str]
    permissions: frozenset[str]

    def has(self, permission: str) -> bool:
        return permission in self.permissions
