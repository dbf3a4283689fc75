"""A database outage: 503 SERVICE_UNAVAILABLE while PostgreSQL is down, and recovery without a
restart when it returns. The test stops and starts an embedded PostgreSQL of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.db.migrate import upgrade_to_head
from tests.conftest import make_settings, seeded
from tests.support.calls import batch, contents, outcome, tool_call
from gateway.db.embedded import EmbeddedPostgres
from tests.support.postgres import remove_embedded, start_embedded
from tests.support.tokens import auth_for

LEAKS = ("Traceback", "asyncpg", "sqlalchemy", "postgres", "127.0.0.1", "gateway-pg-", "Connection", "Error:")


@pytest.fixture
def cluster() -> Iterator[EmbeddedPostgres]:
    cluster = start_embedded()
    try:
        yield cluster
    finally:
        remove_embedded(cluster)


async def create_database(cluster: EmbeddedPostgres) -> str:
    url = cluster.url()  # the gateway's database, made when the data folder was
    await asyncio.to_thread(upgrade_to_head, url)
    await seeded(url)
    return url


def assert_unavailable(response) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "SERVICE_UNAVAILABLE"
    assert response.headers["retry-after"]
    for leak in LEAKS:
        assert leak not in response.text


async def eventually_ok(send, attempts: int = 50):  # type: ignore[no-untyped-def]
    """The first requests after a restart may meet pooled connections the restart closed."""
    for _ in range(attempts):
        response = await send()
        if response.status_code != 503:
            return response
        await asyncio.sleep(0.2)
    return response


async def test_requests_get_503_while_postgres_is_down_and_recover_when_it_returns(
    cluster: EmbeddedPostgres,
) -> None:
    url = await create_database(cluster)
    app = create_app(make_settings(url, database_pool_timeout_s=2.0, policy_cache_s=0.0))
    alice = auth_for("alice")
    async with AsyncTestClient(app=app) as client:
        run = (await client.post("/v1/runs", json={}, headers=alice)).json()["id"]

        async def add(a: int):  # type: ignore[no-untyped-def]
            return await client.post(f"/v1/runs/{run}/tool-calls", json=batch(tool_call("add", {"a": a, "b": 1})),
                                     headers=alice)

        assert (await add(1)).status_code == 200

        await asyncio.to_thread(cluster.stop)
        assert_unavailable(await client.get("/readyz"))
        assert_unavailable(await add(2))
        assert_unavailable(await client.post("/v1/runs", json={}, headers=alice))
        assert_unavailable(await client.get("/v1/tools", headers=alice))
        assert (await client.get("/healthz")).status_code == 200  # alive, only not ready

        await asyncio.to_thread(cluster.start)
        assert (await eventually_ok(lambda: client.get("/readyz"))).status_code == 200
        recovered = await eventually_ok(lambda: add(3))
        assert recovered.status_code == 200
        assert [outcome(c) for c in contents(recovered.json())] == ["OK"]
        assert (await eventually_ok(lambda: client.get("/v1/tools", headers=alice))).status_code == 200
