"""Rate limits are on without any setting, so refused calls cannot grow the audit without
bound: past a user's budget the gateway answers 429 before any guard writes a row."""

from __future__ import annotations

import sqlalchemy as sa

from gateway.settings import Settings
from tests.support import db
from tests.support.calls import batch, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for


def test_the_default_limits_are_on_and_generous():
    settings = Settings()
    assert settings.rate_limits.enabled
    assert (settings.rate_limits.user_rps, settings.rate_limits.user_burst) == (50.0, 100)
    assert (settings.rate_limits.tenant_rps, settings.rate_limits.tenant_burst) == (500.0, 1000)


async def test_refused_calls_past_the_users_budget_are_rate_limited_and_leave_no_audit_row(pg_client, seeded_pg_url):
    # With the default settings, a tenant's own (lower) budget applies: 6 requests, no refill to speak of.
    await db.execute(seeded_pg_url, sa.text(
        "INSERT INTO rate_limit_overrides (tenant_id, scope, rate_per_s, burst) VALUES ('acme', 'user', 0.001, 6)"
    ))
    headers = auth_for("alice")  # a member: create_article is PERMISSION_DENIED, and audited
    run = (await pg_client.post("/v1/runs", headers=headers)).json()["id"]
    statuses = []
    for n in range(12):
        response = await pg_client.post(
            f"/v1/runs/{run}/tool-calls", json=batch(tool_call("create_article", {"title": "t", "body": "b"},
                                                             call_id=f"c{n}")), headers=headers,
        )
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert_error(response, 429, "RATE_LIMITED")
            assert int(response.headers["retry-after"]) >= 1
    assert statuses == [200] * 5 + [429] * 7
    audited = await db.audit_rows(seeded_pg_url, run_id=run, kind="tool_call")
    assert [row.outcome for row in audited] == ["PERMISSION_DENIED"] * 5
    other = await pg_client.get("/v1/tools", headers=auth_for("bob"))  # another user has a budget of their own
    assert other.status_code == 200
