"""The demo seed's second approver: a role that grants `approvals:decide` only, and dave, who
holds it in both demo tenants; what his token may and may not do."""

from __future__ import annotations

import sqlalchemy as sa

from gateway.db.models import RolePermission, User
from tests.support import db
from tests.support.app import seeded
from tests.support.approvals import request_approval
from tests.support.calls import new_run
from tests.support.tokens import auth_for


async def test_the_seed_creates_the_approver_role_and_dave_in_each_tenant_idempotently(pg_url):
    await seeded(pg_url)
    await seeded(pg_url)  # again: nothing doubles
    permissions = RolePermission.__table__
    granted = await db.rows(pg_url, sa.select(permissions.c.tenant_id, permissions.c.permission)
                            .where(permissions.c.role == "approver").order_by(permissions.c.tenant_id))
    assert [tuple(row) for row in granted] == [("acme", "approvals:decide"), ("globex", "approvals:decide")]
    users = User.__table__
    daves = await db.rows(pg_url, sa.select(users.c.tenant_id, users.c.roles).where(users.c.id == "dave")
                          .order_by(users.c.tenant_id))
    assert [tuple(row) for row in daves] == [("acme", ["approver"]), ("globex", ["approver"])]


async def test_the_second_approver_decides_carols_request_and_may_do_nothing_else(client, database_url):
    dave = auth_for("dave")
    run_id = await new_run(client, "carol")
    approval_id = await request_approval(client, run_id, auth_for("carol"), "c1", "create_article",
                                         {"title": "Carol's", "body": "needs someone else"})
    own = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert own.status_code == 403 and own.json()["error"]["code"] == "SELF_APPROVAL_FORBIDDEN"
    listed = await client.get("/v1/admin/approvals", headers=dave)
    assert listed.status_code == 200 and [a["id"] for a in listed.json()["items"]] == [approval_id]
    approved = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=dave)
    assert approved.status_code == 200 and approved.json()["status"] == "succeeded", approved.text
    assert len(await db.articles(database_url, title="Carol's")) == 1
    for path in ("/v1/admin/audit", "/v1/admin/roles", "/v1/admin/tools", "/v1/admin/tenant"):
        response = await client.get(path, headers=dave)
        assert response.status_code == 403, path
    tools = (await client.get("/v1/tools", headers=dave)).json()["tools"]
    assert tools == []

