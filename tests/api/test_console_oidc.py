"""Console sign-in with an OpenID Connect provider (a real one on a loopback port): the
code flow with PKCE, its state used once and bound to the browser, the nonce checked, and
the ID token's identity taken through the same verifier and directory as API tokens. A
sign-in under way lives in its browser's cookie: starting one, open to anyone, writes
nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx
import pytest

from tests.support.oidc_provider import CLIENT_ID, OidcProvider
from tests.support.tls import client_context
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
    provider.extra_claims = {}
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


def only_cookie(client, sign_in: str) -> None:
    """The browser holds this sign-in cookie and nothing else."""
    client.cookies.clear()
    client.cookies.set("gateway_console_oidc", sign_in)


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


async def test_a_callback_replayed_with_its_saved_cookie_is_refused(pg_client):
    """A browser keeping a copy of the sign-in's cookie (or anyone who took it with the
    callback's URL) cannot sign in twice: the provider redeems a code once."""
    path, query = await to_provider_and_back(pg_client)
    saved = pg_client.cookies.get("gateway_console_oidc")
    assert (await pg_client.get(path, params=query)).status_code == 200
    only_cookie(pg_client, saved)
    again = await pg_client.get(path, params=query)
    assert again.status_code == 401 and "could not be completed" in again.text
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_a_refused_callback_clears_the_sign_in_cookie(pg_client):
    path, query = await to_provider_and_back(pg_client)
    refused = await pg_client.get(path, params={**query, "state": "another-state"})
    assert refused.status_code == 401
    assert 'gateway_console_oidc=""' in refused.headers.get("set-cookie", "")
    assert (await pg_client.get(path, params=query)).status_code == 401


async def test_a_cookie_of_another_sign_in_is_refused(pg_client):
    """Two sign-ins in two browsers: each callback needs its own browser's cookie."""
    first_path, first_query = await to_provider_and_back(pg_client)
    first_cookie = pg_client.cookies.get("gateway_console_oidc")
    pg_client.cookies.clear()
    _, second_query = await to_provider_and_back(pg_client)
    only_cookie(pg_client, first_cookie)
    response = await pg_client.get(first_path, params=second_query)
    assert response.status_code == 401
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_an_expired_sign_in_is_refused(pg_client):
    path, query = await to_provider_and_back(pg_client)
    state, nonce, verifier, expires = pg_client.cookies.get("gateway_console_oidc").split(".")
    assert int(expires) > time.time() + 500
    only_cookie(pg_client, f"{state}.{nonce}.{verifier}.{int(time.time()) - 1}")
    response = await pg_client.get(path, params=query)
    assert response.status_code == 401 and "could not be completed" in response.text


@pytest.mark.parametrize("cookie", ["", "x", "a.b.c.d", "A" * 43 + "." + "B" * 43 + "." + "C" * 43 + ".9" * 40,
                                    "A" * 43 + "\x00." + "B" * 43 + "." + "C" * 43 + ".9999999999", "." * 4000])
async def test_hostile_sign_in_cookies_are_refused_without_a_500(pg_client, cookie):
    path, query = await to_provider_and_back(pg_client)
    only_cookie(pg_client, cookie)
    response = await pg_client.get(path, params=query)
    assert response.status_code in (400, 401)


async def _rows_of_every_table(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        rows = await conn.fetch(
            "SELECT c.relname AS name, (xpath('/row/n/text()', query_to_xml("
            "format('SELECT count(*) AS n FROM %I.%I', n.nspname, c.relname), false, true, '')))[1]::text::bigint AS n"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        )
    finally:
        await conn.close()
    return {row["name"]: row["n"] for row in rows}


async def test_starting_sign_ins_writes_nothing(pg_client, seeded_pg_url):
    """The start is open to anyone: a row per request would let anyone grow a table."""
    before = await _rows_of_every_table(seeded_pg_url)
    for _ in range(50):
        assert (await pg_client.get("/console/oidc/start")).status_code == 303
    assert await _rows_of_every_table(seeded_pg_url) == before


async def test_an_id_token_with_another_nonce_is_refused(pg_client, provider):
    provider.nonce_override = "some-other-nonce"
    path, query = await to_provider_and_back(pg_client)
    response = await pg_client.get(path, params=query)
    assert response.status_code == 401
    assert (await pg_client.get("/console/approvals")).status_code == 303


@pytest.mark.parametrize("claims", [
    {"aud": [CLIENT_ID, "another-client"]},  # several audiences: azp must name this client
    {"aud": [CLIENT_ID, "another-client"], "azp": "another-client"},
    {"azp": "another-client"},  # issued to another party
], ids=["two-audiences-no-azp", "two-audiences-other-azp", "other-azp"])
async def test_an_id_token_issued_to_another_party_is_refused(pg_client, provider, claims):
    provider.extra_claims = claims
    path, query = await to_provider_and_back(pg_client)
    assert (await pg_client.get(path, params=query)).status_code == 401
    assert (await pg_client.get("/console/approvals")).status_code == 303


async def test_an_id_token_with_several_audiences_and_this_client_as_azp_signs_in(pg_client, provider):
    provider.extra_claims = {"aud": [CLIENT_ID, "another-client"], "azp": CLIENT_ID}
    path, query = await to_provider_and_back(pg_client)
    assert (await pg_client.get(path, params=query)).status_code in (200, 303)
    assert (await pg_client.get("/console/approvals")).status_code == 200


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


def _client_for(issuer: str, http: httpx.AsyncClient, *, timeout_s: float = 5.0):
    from gateway.console.oidc import OidcClient
    from gateway.settings import Settings

    settings = Settings.from_flat(database_url="postgresql+asyncpg://unused/x", oidc_issuer=issuer,
                                  oidc_client_id=CLIENT_ID, oidc_timeout_s=timeout_s)
    return OidcClient(settings, http)


@pytest.mark.parametrize("endpoint", ["token_endpoint", "jwks_uri", "authorization_endpoint"])
async def test_a_provider_on_https_may_not_send_its_endpoints_to_plain_http(endpoint):
    """The token endpoint gets the client secret and the key set decides whose ID tokens are
    believed: a discovery document may not move either off TLS."""
    from gateway.console.oidc import SignInFailed

    with OidcProvider(tls=True) as secure:
        async with httpx.AsyncClient(verify=client_context()) as http:
            assert (await _client_for(secure.issuer, http).discovery()).token_endpoint.startswith("https://")
            document = {**secure.discovery(), endpoint: f"http://127.0.0.1:9/{endpoint}"}
            secure.raw_answers["/.well-known/openid-configuration"] = json.dumps(document).encode()
            with pytest.raises(SignInFailed) as refused:
                await _client_for(secure.issuer, http).start("https://gw/console/oidc/callback")
    assert refused.value.reason == "discovery_mismatch"


async def test_a_failing_provider_is_asked_once_while_sign_ins_pile_up():
    """Sign-ins are open to anyone: with the provider not answering, each one waited its
    turn for the discovery document (eight starts failed after 1, 2, ... 8 s, eight fetches)."""
    from gateway.console.oidc import SignInFailed

    release = asyncio.Event()
    held: list[asyncio.Task[None]] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await release.wait()
        finally:
            writer.close()
            await writer.wait_closed()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    issuer = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with httpx.AsyncClient() as http:
            client = _client_for(issuer, http, timeout_s=1.0)
            started = time.monotonic()
            outcomes = await asyncio.gather(*(client.start(f"{issuer}/cb") for _ in range(8)), return_exceptions=True)
            elapsed = time.monotonic() - started
    finally:
        release.set()
        await asyncio.gather(*held, return_exceptions=True)
        server.close()
        await server.wait_closed()
    assert all(isinstance(outcome, SignInFailed) for outcome in outcomes)
    assert len(held) == 1 and elapsed < 4, (len(held), elapsed)
