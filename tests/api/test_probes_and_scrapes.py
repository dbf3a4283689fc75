"""The public routes as an operator's tools see them: HEAD on the probes, /metrics' content
type, its token and its tenant labels, and the metrics docs/operations.md lists moving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.wiring import services_of
from tests.support.app import make_settings
from tests.support import db
from tests.support.calls import batch, contents, new_run, tool_call
from tests.support.http import assert_error
from tests.support.loopback import free_port
from tests.support.prometheus import growth, samples, value
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

TOKEN = "metrics-scrape-token-0123456789"


@asynccontextmanager
async def gateway(database_url: str, **overrides: Any) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=create_app(make_settings(database_url, **overrides))) as client:
        yield client


async def scrape(client: AsyncTestClient, **headers: str) -> dict:
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    return samples(response.text)


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_head_answers_the_probes_without_a_body(seeded_pg_url: str, path: str) -> None:
    async with gateway(seeded_pg_url) as client:
        response = await client.head(path)
    assert response.status_code == 200
    assert response.content == b""


async def test_head_on_readyz_says_503_when_the_database_is_down() -> None:
    url = f"postgresql+asyncpg://gateway:pw@127.0.0.1:{free_port()}/gateway"
    async with gateway(url, database_pool_timeout_s=1.0) as client:
        response = await client.head("/readyz")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"


async def test_metrics_content_type_names_one_charset(seeded_pg_url: str) -> None:
    async with gateway(seeded_pg_url) as client:
        response = await client.get("/metrics")
    content_type = response.headers["content-type"]
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert content_type.count("charset") == 1


async def test_with_a_metrics_token_a_scrape_without_it_is_refused_before_any_query(seeded_pg_url: str) -> None:
    async with gateway(seeded_pg_url, metrics_token=TOKEN) as client:
        queries = 0
        gauges = services_of(client.app).metrics_exposition.gauges
        original = gauges.pending

        async def counted(**kwargs: Any) -> Any:
            nonlocal queries
            queries += 1
            return await original(**kwargs)

        gauges.pending = counted  # type: ignore[method-assign]
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            refused = await client.get("/metrics", headers=headers)
            assert_error(refused, 401, "UNAUTHENTICATED")
            assert "gateway_" not in refused.text
        assert queries == 0
        allowed = await scrape(client, Authorization=f"Bearer {TOKEN}")
        assert queries == 1
    assert value(allowed, "gateway_database_up") == 1


async def test_a_user_token_does_not_open_metrics_protected_by_its_own_token(seeded_pg_url: str) -> None:
    async with gateway(seeded_pg_url, metrics_token=TOKEN) as client:
        assert_error(await client.get("/metrics", headers=auth_for("carol")), 401, "UNAUTHENTICATED")


async def _request_approval(client: AsyncTestClient) -> str:
    run = await new_run(client, user="bob")
    response = await client.post(
        f"/v1/runs/{run}/tool-calls",
        json=batch(tool_call("create_article", {"title": "Labels", "body": "Counted."})),
        headers=auth_for("bob"),
    )
    return contents(response.json())[0]["error"]["approval_id"]


@pytest.mark.parametrize(
    ("overrides", "labelled"),
    [({"metrics_token": TOKEN}, True),
     ({}, False),  # an open /metrics does not list the tenants, nor how busy each is
     ({"metrics_tenant_labels": True}, True),
     ({"metrics_tenant_labels": False, "metrics_token": TOKEN}, False)],
    ids=["behind-a-token", "open", "open-labels-asked-for", "behind-a-token-labels-off"],
)
async def test_tenant_labels_are_on_behind_a_scrape_token_unless_set(
    seeded_pg_url: str, overrides: dict[str, Any], labelled: bool
) -> None:
    async with gateway(seeded_pg_url, **overrides) as client:
        await _request_approval(client)
        response = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    scraped = samples(response.text)
    if labelled:
        assert value(scraped, "gateway_approvals_pending", tenant="acme") == 1
    else:
        assert "tenant=" not in response.text and "acme" not in response.text
        assert value(scraped, "gateway_approvals_pending") == 1


async def test_rejections_of_approvals_and_replays_of_calls_are_counted(seeded_pg_url: str) -> None:
    async with gateway(seeded_pg_url) as client:
        before = await scrape(client)
        approval_id = await _request_approval(client)
        rejected = await client.post(
            f"/v1/admin/approvals/{approval_id}/reject", json={"reason": "no"}, headers=auth_for("carol")
        )
        assert rejected.status_code == 200, rejected.text
        run = await new_run(client)
        calls = batch(tool_call("add", {"a": 1, "b": 2}, call_id="call_replayed"))
        for _ in range(2):
            answered = await client.post(f"/v1/runs/{run}/tool-calls", json=calls, headers=auth_for("alice"))
            assert answered.status_code == 200
        after = await scrape(client)
    delta = growth(before, after)
    assert delta("gateway_approvals_decided_total", decision="rejected") == 1
    assert delta("gateway_tool_call_replays_total", tool="add") == 1
    assert delta("gateway_tool_calls_total", tool="add", outcome="OK") == 1
    assert value(after, "process_cpu_seconds_total") > 0


async def test_database_up_is_zero_when_the_database_is_down() -> None:
    url = f"postgresql+asyncpg://gateway:pw@127.0.0.1:{free_port()}/gateway"
    async with gateway(url, database_pool_timeout_s=1.0) as client:
        scraped = await scrape(client)
    assert value(scraped, "gateway_database_up") == 0


async def test_an_approval_found_expired_when_decided_is_counted_as_expired(seeded_pg_url: str) -> None:
    async with gateway(seeded_pg_url) as client:
        before = await scrape(client)
        approval_id = await _request_approval(client)
        await db.expire_approval(seeded_pg_url, approval_id)
        late = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
        assert late.status_code == 409, late.text
        after = await scrape(client)
    assert growth(before, after)("gateway_approvals_decided_total", decision="expired") == 1
