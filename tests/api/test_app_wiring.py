"""Each app owns its services and its metrics: two apps in one process share no counters, and
an app's services exist exactly while its lifespan runs."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.wiring import SLOT_KEY, services_of
from tests.support.app import make_settings
from tests.support.calls import batch, contents, new_run, outcome, tool_call
from tests.support.prometheus import samples, value
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres


async def scrape(client: AsyncTestClient) -> dict:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    return samples(response.text)


async def test_two_apps_in_one_process_count_only_their_own_calls(seeded_pg_url: str) -> None:
    first_app = create_app(make_settings(seeded_pg_url))
    second_app = create_app(make_settings(seeded_pg_url))
    async with AsyncTestClient(app=first_app) as first, AsyncTestClient(app=second_app) as second:
        run = await new_run(first)
        response = await first.post(
            f"/v1/runs/{run}/tool-calls", json=batch(tool_call("add", {"a": 1, "b": 2})), headers=auth_for("alice")
        )
        assert [outcome(c) for c in contents(response.json())] == ["OK"]
        refused = await first.get("/v1/admin/approvals", headers=auth_for("alice"))
        assert refused.status_code == 403
        first_scrape, second_scrape = await scrape(first), await scrape(second)

    assert value(first_scrape, "gateway_tool_calls_total", tool="add", outcome="OK") == 1
    assert value(first_scrape, "gateway_tool_call_requests_total") == 1
    assert value(first_scrape, "gateway_http_errors_total", code="FORBIDDEN") == 1
    assert value(first_scrape, "gateway_rejections_total", code="FORBIDDEN") == 1
    assert value(second_scrape, "gateway_tool_calls_total", tool="add", outcome="OK") == 0
    assert value(second_scrape, "gateway_tool_call_requests_total") == 0
    assert value(second_scrape, "gateway_http_errors_total", code="FORBIDDEN") == 0
    assert value(second_scrape, "gateway_rejections_total", code="FORBIDDEN") == 0


async def test_an_apps_services_exist_only_while_its_lifespan_runs(seeded_pg_url: str) -> None:
    app = create_app(make_settings(seeded_pg_url))
    with pytest.raises(RuntimeError, match="lifespan"):
        services_of(app)
    async with AsyncTestClient(app=app) as client:
        services = services_of(app)
        assert services.settings.database.url == seeded_pg_url
        assert (await client.get("/readyz")).status_code == 200
    with pytest.raises(RuntimeError, match="lifespan"):
        services_of(app)


async def test_app_state_holds_the_services_slot_and_nothing_else(seeded_pg_url: str) -> None:
    app = create_app(make_settings(seeded_pg_url))
    assert list(app.state.dict()) == [SLOT_KEY]
    async with AsyncTestClient(app=app) as client:
        assert (await client.get("/v1/tools", headers=auth_for("alice"))).status_code == 200
        assert list(app.state.dict()) == [SLOT_KEY]
