"""Console sign-in with an OpenID Connect provider (a real one on a loopback port): the
code flow with PKCE, its state used once and bound to the browser, the nonce checked, and
the ID token's identity taken through the same verifier and directory as API tokens."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.support.oidc_provider import CLIENT_ID, OidcProvider
from tests.support.tokens import make_token


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    with OidcProvider() as running:
        yield running


@pytest.fixture
def settings_overrides(provider):
    return provider.settings()


@pytest.fixture(autouse=True)
def fresh(pg_client, provider):
    pg_client.follow_redirects = False
    provider.nonce_override = None
    provider.user, provider.roles = "carol", ["admin"]
    provider.raw_answers = {}


async def to_provider_and_back(client) -> tuple[str, dict[str, str]]:
    """Start a sign-in, let the provider answer; the callback path and its query."""
    start = await client.get("/console/oidc/start")
    assert start.status_code == 303, start.text
    authorize = start.headers["location"]
    back = httpx.get(authorize, follow_redirects=False, timeout=5)
    assert back.status_code == 302
    callback = urlsplit(back.headers["location"])
    return callback.path, {key: values[0] for key, values in parse_qs(callback.query).items()}


async def test_the_sign_in_page_offers_the_provider_and_no_token_form(pg_client):
    page = await pg_client.get("/console/sign-in")
    assert "/console/oidc/start" in page.text and 'name="token"' not in page.text


async def test_with_a_provider_a_token_posted_to_the_sign_in_form_starts_no_session(pg_client):
    """The provider is the only way in: an API token (an agent's, say) cannot be turned into a
    console session by posting the form the page no longer shows."""
    await pg_client.get("/console/sign-in")
    form_token = pg_client.cookies.get("gateway_console_sign_in")
    assert form_token
    response = await pg_client.post(
        "/console/sign-in", data={"csrf_token": form_token, "token": make_token("acme", "carol")}
    )
    assert response.status_code == 404 and "text/html" in response.headers["content-type"]
    assert "gateway_console=" not in response.headers.get("set-cookie", "")
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_the_authorization_request_carries_state_nonce_and_an_s256_challenge(pg_client, provider):
    await to_provider_and_back(pg_client)
    asked = provider.authorize_requests[-1]
    assert asked["client_id"] == CLIENT_ID and asked["response_type"] == "code" and asked["scope"] == "openid"
    assert asked["code_challenge_method"] == "S256" and len(asked["code_challenge"]) == 43
    assert len(asked["state"]) >= 43 and len(asked["nonce"]) >= 43
    assert asked["redirect_uri"].endswith("/console/oidc/callback")


async def test_the_code_flow_signs_in_with_the_id_tokens_identity(pg_client, provider):
    path, query = await to_provider_and_back(pg_client)
    done = await pg_client.get(path, params=query)
    assert done.status_code == 200 and 'http-equiv="refresh"' in done.text
    token_request = provider.token_requests[-1]
    assert token_request["code_verifier"] and token_request["grant_type"] == "authorization_code"
    page = await pg_client.get("/console/approvals")
    assert page.status_code == 200 and "carol · acme" in page.text


async def test_a_state_works_once(pg_client):
    path, query = await to_provider_and_back(pg_client)
    assert (await pg_client.get(path, params=query)).status_code == 200
    pg_client.cookies.delete("gateway_console")
    again = await pg_client.get(path, params=query)
    assert again.status_code == 401
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_a_callback_in_another_browser_is_refused(pg_client):
    path, query = await to_provider_and_back(pg_client)
    pg_client.cookies.clear()
    response = await pg_client.get(path, params=query)
    assert response.status_code == 401 and "could not be completed" in response.text


async def test_an_id_token_with_another_nonce_is_refused(pg_client, provider):
    provider.nonce_override = "some-other-nonce"
    path, query = await to_provider_and_back(pg_client)
    response = await pg_client.get(path, params=query)
    assert response.status_code == 401
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_an_id_token_for_an_unknown_tenant_is_refused(pg_client, provider):
    provider.tenant = "nobody"
    try:
        path, query = await to_provider_and_back(pg_client)
        assert (await pg_client.get(path, params=query)).status_code == 401
    finally:
        provider.tenant = "acme"


@pytest.mark.parametrize("query", [{}, {"state": "x\x00", "code": "c"}, {"state": "s" * 5000, "code": "c"},
                                   {"error": "access_denied"}])
async def test_hostile_or_failed_callbacks_are_refused_without_a_500(pg_client, query):
    response = await pg_client.get("/console/oidc/callback", params=query)
    assert response.status_code in (400, 401)


DEEP = b"[" * 5000 + b"]" * 5000


async def test_a_discovery_document_nested_too_deep_is_a_provider_failure_not_a_500(pg_client, provider):
    provider.raw_answers["/.well-known/openid-configuration"] = (
        b'{"issuer":"' + provider.issuer.encode() + b'","authorization_endpoint":"http://a","token_endpoint":'
        b'"http://a","jwks_uri":"http://a","x":' + DEEP + b"}"
    )
    response = await pg_client.get("/console/oidc/start")
    assert response.status_code == 503 and "cannot be reached" in response.text


async def test_a_token_answer_nested_too_deep_signs_nobody_in_and_is_not_a_500(pg_client, provider):
    path, query = await to_provider_and_back(pg_client)
    provider.raw_answers["/token"] = b'{"id_token":"x","x":' + DEEP + b"}"
    response = await pg_client.get(path, params=query)
    assert response.status_code == 401 and "could not be completed" in response.text
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_a_key_set_nested_too_deep_signs_nobody_in_and_is_not_a_500(pg_client, provider):
    path, query = await to_provider_and_back(pg_client)
    provider.raw_answers["/jwks"] = b'{"keys":[],"x":' + DEEP + b"}"
    response = await pg_client.get(path, params=query)
    assert response.status_code == 401 and "could not be completed" in response.text


async def test_an_unreachable_provider_is_explained(seeded_pg_url):
    from litestar.testing import AsyncTestClient

    from gateway.app import create_app
    from tests.support.app import make_settings
    from tests.support.loopback import free_port

    settings = make_settings(seeded_pg_url, oidc_issuer=f"http://127.0.0.1:{free_port()}", oidc_client_id="c",
                             oidc_timeout_s=1.0)
    async with AsyncTestClient(app=create_app(settings)) as client:
        response = await client.get("/console/oidc/start", follow_redirects=False)
        assert response.status_code == 503 and "cannot be reached" in response.text


async def test_without_a_provider_the_oidc_routes_are_not_found(seeded_pg_url):
    from litestar.testing import AsyncTestClient

    from gateway.app import create_app
    from tests.support.app import make_settings

    async with AsyncTestClient(app=create_app(make_settings(seeded_pg_url))) as client:
        assert (await client.get("/console/oidc/start", follow_redirects=False)).status_code == 404
