"""One pooled HTTP client per process, shaped by the settings, closed on shutdown."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.wiring import services_of
from tests.support.app import make_settings


async def test_one_pooled_client_from_settings_shared_by_http_tools_and_closed_on_shutdown(pg_url: str):
    settings = make_settings(
        pg_url, http_max_connections=7, http_max_keepalive_connections=3, http_connect_timeout_s=1.5,
        tool_timeout_s=4.0,
    )
    app = create_app(settings)
    async with AsyncTestClient(app=app):
        services = services_of(app)
        http = services.http
        assert http.follow_redirects is False
        assert (http.timeout.connect, http.timeout.read) == (1.5, 4.0)
        pool = http._transport._pool  # the transport's pool: where the limits end up
        assert (pool.max_connections, pool.max_keepalive_connections) == (7, 3)
        assert services.service_calls.client is http
    assert http.is_closed
    with pytest.raises(RuntimeError, match="lifespan"):
        services.service_calls.client
