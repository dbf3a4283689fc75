"""The resource metadata names the identity provider when tokens come from one."""

from __future__ import annotations

from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.support.app import make_settings


async def test_jwks_mode_names_the_configured_issuer(database_url):
    settings = make_settings(database_url, jwks_url="http://127.0.0.1:9/jwks.json", jwt_issuer="https://idp.example",
                             jwt_audience="gateway")
    async with AsyncTestClient(app=create_app(settings)) as client:
        response = await client.get("/.well-known/oauth-protected-resource/mcp")
    assert response.status_code == 200
    assert response.json() == {
        "resource": "http://testserver.local/mcp",
        "bearer_methods_supported": ["header"],
        "authorization_servers": ["https://idp.example"],
        "resource_name": "gateway",
    }


async def test_a_shared_secret_names_no_authorization_server(database_url):
    settings = make_settings(database_url, jwt_issuer="https://idp.example")
    async with AsyncTestClient(app=create_app(settings)) as client:
        response = await client.get("/.well-known/oauth-protected-resource")
    assert "authorization_servers" not in response.json()


async def test_the_metadata_names_the_requests_host_and_no_shared_cache_keeps_it(database_url):
    async with AsyncTestClient(app=create_app(make_settings(database_url))) as client:
        response = await client.get("/.well-known/oauth-protected-resource/mcp", headers={"Host": "evil.example"})
    assert response.json()["resource"] == "http://evil.example/mcp"
    assert response.headers["cache-control"].startswith("private") and response.headers["vary"] == "Host"
