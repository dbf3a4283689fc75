"""The demo tenants: what `gateway seed-demo` creates (idempotent)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.db.models import Article
from gateway.db.tenants import create_tenant, ensure_role, ensure_user
from gateway.db.types import utcnow

MEMBER = frozenset({"articles:read", "calculator:use", "time:read"})
EDITOR = MEMBER | {"articles:write", "articles:edit_any"}
ADMIN = EDITOR | {"approvals:decide", "audit:read", "roles:manage", "tools:manage", "tenants:manage",
                  "webhooks:manage"}
APPROVER = frozenset({"approvals:decide"})
"""Decides approvals and nothing else: listing, reading and deciding them all need only this
permission, and the frozen call runs as its requester, never with the approver's rights."""

DEMO_ROLES: dict[str, tuple[str, frozenset[str]]] = {
    "member": ("Reads articles, uses the calculator and the clock.", MEMBER),
    "editor": ("A member who also writes and edits any article.", EDITOR),
    "admin": ("An editor who also decides approvals, reads the audit and administers the tenant.", ADMIN),
    "approver": ("Lists, reads and decides approvals; nothing else.", APPROVER),
}


@dataclass(frozen=True)
class DemoUser:
    id: str
    name: str
    roles: tuple[str, ...]


DEMO_TENANTS = {"acme": "Acme Corporation", "globex": "Globex Corporation"}
DEMO_USERS = (
    DemoUser("alice", "Alice (member)", ("member",)),
    DemoUser("bob", "Bob (editor)", ("editor",)),
    DemoUser("carol", "Carol (admin)", ("admin",)),
    DemoUser("dave", "Dave (approver)", ("approver",)),
)
DEMO_APPROVER = "dave"
"""A second approver: carol's own writes need someone else's decision (no self-approval)."""
DEMO_ARTICLES = (
    ("Getting started with the gateway", "Every tool call a model makes goes through the gateway's guards."),
    ("Expense policy", "Expenses above 500 need a manager's approval before they are paid."),
)


async def seed_demo(db: Database) -> None:
    async with db.begin() as conn:
        for tenant_id, name in DEMO_TENANTS.items():
            await create_tenant(conn, tenant_id=tenant_id, name=name)
            for role, (description, permissions) in DEMO_ROLES.items():
                await ensure_role(conn, tenant_id=tenant_id, name=role, description=description,
                                  permissions=permissions)
            for user in DEMO_USERS:
                await ensure_user(conn, tenant_id=tenant_id, user_id=user.id, display_name=user.name,
                                  roles=list(user.roles))
            articles = Article.__table__
            has_articles = await conn.scalar(
                sa.select(sa.func.count()).select_from(articles).where(articles.c.tenant_id == tenant_id)
            )
            if not has_articles:
                now = utcnow()
                await conn.execute(
                    sa.insert(articles),
                    [
                        {"id": f"art_demo_{tenant_id}_{i}", "tenant_id": tenant_id, "author_id": "bob",
                         "title": title, "body": f"{body} ({name})", "created_at": now, "updated_at": now}
                        for i, (title, body) in enumerate(DEMO_ARTICLES, start=1)
                    ],
                )
