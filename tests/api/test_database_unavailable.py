"""A database that cannot be reached is 503 SERVICE_UNAVAILABLE (retryable), in the envelope,
with nothing of the connection error in the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.support.app import make_settings
from tests.support.http import assert_error
from tests.support.loopback import free_port
from tests.support.tokens import auth_for

UNREACHABLE = {
    "postgres": f"postgresql+asyncpg://gateway:pw@127.0.0.1:{free_port()}/gateway",
    "unix-socket": "postgresql+asyncpg://postgres@/gateway?host=/nonexistent-folder-for-tests",
}


@pytest.fixture(params=sorted(UNREACHABLE))
async def down(request) -> AsyncIterator[AsyncTestClient]:
    app = create_app(make_settings(UNREACHABLE[request.param], database_pool_timeout_s=1.0))
    async with AsyncTestClient(app=app) as client:
        yield client


async def test_readyz_is_service_unavailable(down):
    assert_error(await down.get("/readyz"), 503, "SERVICE_UNAVAILABLE")


async def test_healthz_still_answers(down):
    assert (await down.get("/healthz")).status_code == 200


async def test_an_api_call_is_service_unavailable_and_leaks_nothing(down):
    response = await down.post("/v1/runs", headers=auth_for("alice"))
    assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert response.headers["retry-after"] == "1"
    for detail in ("127.0.0.1", "nonexistent-folder", "gateway:pw", "refused", "asyncpg"):
        assert detail not in response.text
