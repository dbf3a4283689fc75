"""POST /v1/runs and GET /v1/runs/{id}: runs belong to one user of one tenant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from gateway.db.models import Tenant
from tests.support import db
from tests.support.calls import batch, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for

ALICE = auth_for("alice")


async def test_a_run_is_created_with_default_limits(client):
    response = await client.post("/v1/runs", headers=ALICE)
    assert response.status_code == 201
    run = response.json()
    assert run["id"].startswith("run_")
    assert (run["tenant_id"], run["user_id"], run["status"]) == ("acme", "alice", "active")
    assert run["limits"]["max_tool_calls"] == 50 and run["limits"]["max_repeats"] == 2
    assert run["usage"]["tool_calls"] == 0
    expires = datetime.fromisoformat(run["limits"]["expires_at"])
    created = datetime.fromisoformat(run["created_at"])
    assert expires - created == timedelta(seconds=86_400)


async def test_limits_may_be_given_at_the_top_level(client):
    run = (await client.post("/v1/runs", json={"max_tool_calls": 7, "max_repeats": 1}, headers=ALICE)).json()
    assert (run["limits"]["max_tool_calls"], run["limits"]["max_repeats"]) == (7, 1)


async def test_limits_may_be_given_under_limits(client):
    run = (await client.post("/v1/runs", json={"limits": {"max_tool_calls": 9, "max_repeats": 3}}, headers=ALICE)).json()
    assert (run["limits"]["max_tool_calls"], run["limits"]["max_repeats"]) == (9, 3)


async def test_limits_in_both_places_are_refused(client):
    response = await client.post("/v1/runs", json={"max_tool_calls": 3, "limits": {"max_repeats": 1}}, headers=ALICE)
    assert_error(response, 400, "INVALID_REQUEST")


async def test_an_explicit_expiry_is_kept(client):
    expires_at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    run = (await client.post("/v1/runs", json={"expires_at": expires_at.isoformat()}, headers=ALICE)).json()
    assert datetime.fromisoformat(run["limits"]["expires_at"]) == expires_at


async def test_max_tool_calls_is_clamped_by_the_default_tenant_cap(client):
    run = (await client.post("/v1/runs", json={"max_tool_calls": 5_000_000}, headers=ALICE)).json()
    assert run["limits"]["max_tool_calls"] == 100_000


async def test_limits_are_clamped_by_the_tenants_caps(client, database_url):
    await db.execute(
        database_url,
        sa.update(Tenant).where(Tenant.id == "acme").values(
            max_tool_calls_per_run=20, max_repeats_per_call=4, max_run_ttl_s=3600
        ),
    )
    far = (datetime.now(UTC) + timedelta(days=10)).isoformat()
    run = (await client.post("/v1/runs", json={"max_tool_calls": 500, "max_repeats": 50, "expires_at": far}, headers=ALICE)).json()
    assert (run["limits"]["max_tool_calls"], run["limits"]["max_repeats"]) == (20, 4)
    expires = datetime.fromisoformat(run["limits"]["expires_at"])
    assert expires - datetime.fromisoformat(run["created_at"]) <= timedelta(hours=1)
    other = (await client.post("/v1/runs", json={"max_tool_calls": 500}, headers=auth_for("alice", tenant="globex"))).json()
    assert other["limits"]["max_tool_calls"] == 500


@pytest.mark.parametrize(
    "body",
    [
        {"max_tool_calls": 0},
        {"max_tool_calls": -1},
        {"max_repeats": 0},
        {"unknown": 1},
        {"user_id": "bob"},
        {"tenant_id": "globex"},
        {"expires_at": "2001-01-01T00:00:00Z"},
        {"expires_at": "2999-01-01T00:00:00"},
        {"expires_at": "tomorrow"},
    ],
    ids=["zero-calls", "negative", "zero-repeats", "unknown-field", "user-id", "tenant-id",
         "expiry-past", "expiry-naive", "expiry-garbage"],
)
async def test_invalid_limits_are_invalid_request(client, body):
    assert_error(await client.post("/v1/runs", json=body, headers=ALICE), 400, "INVALID_REQUEST")


async def test_the_owner_reads_the_run_with_its_usage(client):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    call = tool_call("add", {"a": 1, "b": 2}, call_id="c1")
    await client.post(f"/v1/runs/{run['id']}/tool-calls", json=batch(call), headers=ALICE)
    response = await client.get(f"/v1/runs/{run['id']}", headers=ALICE)
    assert response.status_code == 200
    assert response.json()["usage"]["tool_calls"] == 1
    assert response.json()["limits"] == run["limits"]


async def test_an_expired_run_reads_as_expired(client, database_url):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    await db.expire_run(database_url, run["id"])
    assert (await client.get(f"/v1/runs/{run['id']}", headers=ALICE)).json()["status"] == "expired"


async def test_another_users_run_is_not_found(client):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    assert_error(await client.get(f"/v1/runs/{run['id']}", headers=auth_for("bob")), 404, "NOT_FOUND")


async def test_another_tenants_run_is_not_found(client):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    response = await client.get(f"/v1/runs/{run['id']}", headers=auth_for("alice", tenant="globex"))
    assert_error(response, 404, "NOT_FOUND")


async def test_an_admin_cannot_read_another_users_run_either(client):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    assert_error(await client.get(f"/v1/runs/{run['id']}", headers=auth_for("carol")), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    "headers", [auth_for("bob"), auth_for("alice", tenant="globex")], ids=["other-user", "other-tenant"]
)
async def test_tool_calls_on_a_run_of_someone_else_are_not_found_and_run_nothing(client, database_url, headers):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    body = batch(tool_call("add", {"a": 1, "b": 2}, call_id="c1"))
    assert_error(await client.post(f"/v1/runs/{run['id']}/tool-calls", json=body, headers=headers), 404, "NOT_FOUND")
    assert await db.tool_call_rows(database_url, run["id"]) == []
    assert (await client.get(f"/v1/runs/{run['id']}", headers=ALICE)).json()["usage"]["tool_calls"] == 0


@pytest.mark.parametrize(
    "headers", [auth_for("bob"), auth_for("alice", tenant="globex")], ids=["other-user", "other-tenant"]
)
async def test_a_malformed_batch_on_a_run_of_someone_else_is_not_found(client, database_url, headers):
    run = (await client.post("/v1/runs", headers=ALICE)).json()
    response = await client.post(f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": []}, headers=headers)
    assert_error(response, 404, "NOT_FOUND")
    assert await db.audit_rows(database_url, run_id=run["id"]) == []


async def test_tool_calls_on_an_unknown_run_are_not_found(client):
    body = batch(tool_call("add", {"a": 1, "b": 2}, call_id="c1"))
    assert_error(await client.post("/v1/runs/run_nope/tool-calls", json=body, headers=ALICE), 404, "NOT_FOUND")
