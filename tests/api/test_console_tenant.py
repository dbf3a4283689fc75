"""The console's tenant page over HTTP: roles and tool policies, changed through the admin
service with its checks and audit rows, by users whose permissions allow it."""

from __future__ import annotations

import pytest

from tests.support import db
from tests.support.console import page_csrf, sign_in
from tests.support.tokens import auth_for


@pytest.fixture(autouse=True)
def no_redirects(pg_client):
    pg_client.follow_redirects = False


async def test_the_tenant_page_lists_roles_and_tool_policies(pg_client):
    await sign_in(pg_client)
    response = await pg_client.get("/console/tenant")
    assert response.status_code == 200
    assert 'data-role="member"' in response.text and 'data-tool="create_article"' in response.text


async def test_a_role_change_goes_through_the_admin_service_and_is_audited(pg_client, seeded_pg_url):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, "/console/tenant")
    response = await pg_client.post(
        "/console/tenant/roles/member", data={"csrf_token": csrf, "permissions": "articles:read\ncalculator:use"}
    )
    assert response.status_code == 303
    role = (await pg_client.get("/v1/admin/roles/member", headers=auth_for("carol"))).json()
    assert role["permissions"] == ["articles:read", "calculator:use"]
    (row,) = await db.audit_rows(seeded_pg_url, kind="admin_change")
    assert row.user_id == "carol" and row.detail["action"] == "role.update"


async def test_taking_roles_manage_from_ones_own_role_is_refused_in_words(pg_client):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, "/console/tenant")
    response = await pg_client.post("/console/tenant/roles/admin", data={"csrf_token": csrf, "permissions": "x:y"})
    assert response.status_code == 409 and "roles:manage" in response.text


async def test_an_invalid_permission_is_explained(pg_client):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, "/console/tenant")
    response = await pg_client.post("/console/tenant/roles/member", data={"csrf_token": csrf, "permissions": "<b>"})
    assert response.status_code == 400 and "not valid" in response.text


async def test_a_tool_policy_change_is_applied_and_audited(pg_client, seeded_pg_url):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, "/console/tenant")
    response = await pg_client.post(
        "/console/tenant/tools/add", data={"csrf_token": csrf, "approval_mode": "always"}  # enabled unticked
    )
    assert response.status_code == 303
    policy = (await pg_client.get("/v1/admin/tools/add", headers=auth_for("carol"))).json()["policy"]
    assert policy["enabled"] is False and policy["approval_mode"] == "always"
    (row,) = await db.audit_rows(seeded_pg_url, kind="admin_change")
    assert row.detail["action"] == "tool_policy.update"


async def test_letting_a_mutating_tool_skip_approval_is_refused_as_by_the_api(pg_client):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, "/console/tenant")
    response = await pg_client.post(
        "/console/tenant/tools/create_article", data={"csrf_token": csrf, "enabled": "on", "approval_mode": "never"}
    )
    assert response.status_code == 403 and "operator" in response.text


async def test_unknown_names_are_404_pages_and_others_get_403(pg_client):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, "/console/tenant")
    for path in ("/console/tenant/roles/nobody", "/console/tenant/tools/no_tool", "/console/tenant/roles/a%00b"):
        response = await pg_client.post(path, data={"csrf_token": csrf, "permissions": "a:b", "approval_mode": "always"})
        assert response.status_code == 404, path
    pg_client.cookies.clear()
    await sign_in(pg_client, "bob")
    assert (await pg_client.get("/console/tenant")).status_code == 403
