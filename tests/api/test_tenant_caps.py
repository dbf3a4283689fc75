"""The tenant's caps on run limits: read and changed with tenants:manage, audited, applied to new runs."""

from __future__ import annotations

from tests.support.tokens import auth_for

CAROL = auth_for("carol")


async def test_read_the_tenant_and_its_caps(client):
    response = await client.get("/v1/admin/tenant", headers=CAROL)
    assert response.status_code == 200
    assert response.json() == {
        "id": "acme",
        "name": "Acme Corporation",
        "disabled": False,
        "caps": {"max_tool_calls_per_run": 100_000, "max_repeats_per_call": 100, "max_run_ttl_s": 2_592_000},
        "agent_loop": {"llm_provider": None, "allow_client_tools": False},
    }


async def test_lowered_caps_clamp_new_runs_and_are_audited(client):
    response = await client.patch(
        "/v1/admin/tenant", json={"max_tool_calls_per_run": 5, "max_repeats_per_call": 1}, headers=CAROL
    )
    assert response.status_code == 200
    assert response.json()["caps"]["max_tool_calls_per_run"] == 5
    assert response.json()["caps"]["max_run_ttl_s"] == 2_592_000

    run = await client.post("/v1/runs", json={"max_tool_calls": 40, "max_repeats": 3}, headers=auth_for("alice"))
    assert run.json()["limits"]["max_tool_calls"] == 5
    assert run.json()["limits"]["max_repeats"] == 1
    other = await client.post("/v1/runs", json={"max_tool_calls": 40}, headers=auth_for("alice", "globex"))
    assert other.json()["limits"]["max_tool_calls"] == 40

    audit = await client.get("/v1/admin/audit", headers=CAROL)
    [row] = [i for i in audit.json()["items"] if i["kind"] == "admin_change"]
    assert row["detail"]["action"] == "tenant.caps"
    assert row["detail"]["before"]["max_tool_calls_per_run"] == 100_000
    assert row["detail"]["after"]["max_tool_calls_per_run"] == 5


async def test_caps_need_tenants_manage_and_valid_values(client):
    response = await client.patch("/v1/admin/tenant", json={"max_tool_calls_per_run": 5}, headers=auth_for("bob"))
    assert response.status_code == 403
    response = await client.patch("/v1/admin/tenant", json={"max_tool_calls_per_run": 0}, headers=CAROL)
    assert response.status_code == 400
    response = await client.patch("/v1/admin/tenant", json={"disabled": True}, headers=CAROL)
    assert response.status_code == 400
