"""Roles → permissions administration: gated by roles:manage, scoped to the caller's tenant."""

from __future__ import annotations

from tests.support.calls import tool_names
from tests.support.tokens import auth_for

CAROL = auth_for("carol")


async def _audit_rows(client, action: str) -> list[dict]:
    response = await client.get("/v1/admin/audit", headers=CAROL)
    return [i for i in response.json()["items"] if i["kind"] == "admin_change" and i["detail"]["action"] == action]


async def test_lists_the_tenants_roles_with_their_permissions(client):
    response = await client.get("/v1/admin/roles", headers=CAROL)
    assert response.status_code == 200
    roles = {r["name"]: r for r in response.json()["items"]}
    assert set(roles) == {"admin", "approver", "editor", "member"}
    assert roles["approver"]["permissions"] == ["approvals:decide"]
    assert roles["member"]["permissions"] == ["articles:read", "calculator:use", "time:read"]


async def test_create_change_and_delete_a_role_each_audited(client):
    created = await client.post(
        "/v1/admin/roles",
        json={"name": "auditor", "description": "Reads the audit.", "permissions": ["audit:read", "audit:read"]},
        headers=CAROL,
    )
    assert created.status_code == 201, created.text
    assert created.json() == {"name": "auditor", "description": "Reads the audit.", "permissions": ["audit:read"]}

    changed = await client.put(
        "/v1/admin/roles/auditor", json={"permissions": ["audit:read", "time:read"]}, headers=CAROL
    )
    assert changed.status_code == 200
    assert changed.json()["permissions"] == ["audit:read", "time:read"]
    assert changed.json()["description"] == "Reads the audit."

    deleted = await client.delete("/v1/admin/roles/auditor", headers=CAROL)
    assert deleted.status_code == 204
    assert (await client.get("/v1/admin/roles/auditor", headers=CAROL)).status_code == 404

    [create] = await _audit_rows(client, "role.create")
    assert create["user_id"] == "carol" and create["detail"]["before"] is None
    assert create["detail"]["after"]["permissions"] == ["audit:read"]
    [update] = await _audit_rows(client, "role.update")
    assert update["detail"]["before"]["permissions"] == ["audit:read"]
    assert update["detail"]["after"]["permissions"] == ["audit:read", "time:read"]
    [delete] = await _audit_rows(client, "role.delete")
    assert delete["detail"]["before"]["name"] == "auditor" and delete["detail"]["after"] is None


async def test_a_role_change_is_honoured_at_once(client):
    assert "create_article" not in await tool_names(client, "alice")
    response = await client.put(
        "/v1/admin/roles/member",
        json={"permissions": ["articles:read", "articles:write", "calculator:use", "time:read"]},
        headers=CAROL,
    )
    assert response.status_code == 200
    assert "create_article" in await tool_names(client, "alice")


async def test_a_taken_role_name_is_a_conflict(client):
    response = await client.post("/v1/admin/roles", json={"name": "member", "permissions": []}, headers=CAROL)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "CONFLICT"


async def test_an_admin_cannot_take_roles_manage_from_their_own_roles(client):
    response = await client.put("/v1/admin/roles/admin", json={"permissions": ["audit:read"]}, headers=CAROL)
    assert response.status_code == 409
    assert (await client.delete("/v1/admin/roles/admin", headers=CAROL)).status_code == 409
    still = await client.get("/v1/admin/roles/admin", headers=CAROL)
    assert "roles:manage" in still.json()["permissions"]
    assert await _audit_rows(client, "role.update") == []


async def test_another_tenants_role_is_not_found(client):
    created = await client.post("/v1/admin/roles", json={"name": "acme-only", "permissions": []}, headers=CAROL)
    assert created.status_code == 201
    globex = auth_for("carol", "globex")
    assert (await client.get("/v1/admin/roles/acme-only", headers=globex)).status_code == 404
    assert (await client.put("/v1/admin/roles/acme-only", json={"permissions": []}, headers=globex)).status_code == 404
    assert (await client.delete("/v1/admin/roles/acme-only", headers=globex)).status_code == 404
    assert (await client.get("/v1/admin/roles/acme-only", headers=CAROL)).status_code == 200


async def test_roles_need_roles_manage(client):
    for user in ("alice", "bob"):
        response = await client.get("/v1/admin/roles", headers=auth_for(user))
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "FORBIDDEN"
    response = await client.post(
        "/v1/admin/roles", json={"name": "x", "permissions": ["roles:manage"]}, headers=auth_for("bob")
    )
    assert response.status_code == 403


async def test_malformed_permissions_are_refused(client):
    for permission in ("no-colon", "Upper:case", "a:b c", ""):
        response = await client.post(
            "/v1/admin/roles", json={"name": "odd", "permissions": [permission]}, headers=CAROL
        )
        assert response.status_code == 400, permission


async def test_a_name_or_permission_with_a_final_newline_is_refused_and_nothing_is_stored(client):
    # Python's `$` matches before a final newline: the patterns must not let "ops\n" through.
    for role in ({"name": "ops\n", "permissions": ["articles:read"]},
                 {"name": "ops", "permissions": ["articles:read\n"]}):
        response = await client.post("/v1/admin/roles", json=role, headers=CAROL)
        assert response.status_code == 400, role
        assert response.json()["error"]["code"] == "INVALID_REQUEST"
    names = [r["name"] for r in (await client.get("/v1/admin/roles", headers=CAROL)).json()["items"]]
    assert not [n for n in names if n.startswith("ops")]
