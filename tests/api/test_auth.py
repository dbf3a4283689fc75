"""Every /v1 route needs a valid bearer token; every failure is the same 401 envelope."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from gateway.db.models import Tenant
from tests.support import db
from tests.support.http import assert_error
from tests.support import keys, tokens
from tests.support.keys import ec_key, hs256_over_text, hs256_with_raw_key, public_pem, rsa_key, signed, unsigned
from tests.support.tokens import auth

ISSUER, AUDIENCE = "https://id.acme.example", "gateway"
FOR_US = {"iss": ISSUER, "aud": AUDIENCE}


def claims(**changes):
    """Claims as the identity provider issues them for this gateway."""
    return keys.claims(**{**FOR_US, **changes})


def make_token(*args, extra=None, **kwargs):
    return tokens.make_token(*args, extra={**FOR_US, **(extra or {})}, **kwargs)


def auth_for(user="alice", tenant="acme", **kwargs):
    return auth(make_token(tenant, user, **kwargs))


@pytest.fixture
def settings_overrides(jwks_server):
    return {"jwks_url": jwks_server.url, "jwt_issuer": ISSUER, "jwt_audience": AUDIENCE}


async def tools_with(client, headers):
    return await client.get("/v1/tools", headers=headers)


def assert_unauthenticated(response) -> None:
    assert_error(response, 401, "UNAUTHENTICATED")
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_a_valid_token_is_accepted(client):
    assert (await tools_with(client, auth_for("alice"))).status_code == 200


async def test_a_missing_authorization_header_is_unauthenticated(client):
    assert_unauthenticated(await client.get("/v1/tools"))


@pytest.mark.parametrize("header", ["Bearer", "Bearer   ", "Token abc", "Basic YWxpY2U6cHc=", "bearer"])
async def test_a_malformed_authorization_header_is_unauthenticated(client, header):
    assert_unauthenticated(await tools_with(client, {"Authorization": header}))


async def test_a_malformed_token_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth("not.a.jwt")))


async def test_an_expired_token_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", ttl=-10)))


async def test_a_token_with_nbf_in_the_future_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", extra={"nbf": int(time.time()) + 600})))


async def test_a_token_with_iat_in_the_future_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", extra={"iat": int(time.time()) + 600})))


async def test_a_token_with_a_wrong_signature_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", secret="x" * 48)))


async def test_a_token_with_alg_none_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth(unsigned(claims(roles=["admin"])))))


async def test_an_hs256_token_signed_with_the_rsa_public_key_is_unauthenticated(client):
    token = hs256_with_raw_key(public_pem(rsa_key("rsa-1")), claims(roles=["admin"]), kid="rsa-1")
    assert_unauthenticated(await tools_with(client, auth(token)))


async def test_an_rs256_token_from_the_jwks_is_accepted(client, jwks_server):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", claims(user="bob", roles=["editor"]))
    response = await tools_with(client, auth(token))
    assert response.status_code == 200
    assert "create_article" in response.text


async def test_an_es256_token_from_the_jwks_is_accepted(client, jwks_server):
    token = signed(ec_key("ec-1"), "ES256", "ec-1", claims())
    assert (await tools_with(client, auth(token))).status_code == 200


async def test_jwks_keys_are_fetched_once_and_cached(client, jwks_server):
    for user in ("u1", "u2", "u3"):
        token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", claims(user=user))
        assert (await tools_with(client, auth(token))).status_code == 200
    assert jwks_server.fetches == 1


async def test_a_token_with_an_unknown_kid_is_unauthenticated(client, jwks_server):
    token = signed(rsa_key("rsa-2"), "RS256", "rsa-2", claims())
    assert_unauthenticated(await tools_with(client, auth(token)))


async def test_a_token_signed_by_another_key_under_a_known_kid_is_unauthenticated(client, jwks_server):
    token = signed(rsa_key("attacker"), "RS256", "rsa-1", claims(roles=["admin"]))
    assert_unauthenticated(await tools_with(client, auth(token)))


async def test_a_token_for_an_unknown_tenant_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", tenant="initech")))


async def test_roles_as_a_string_are_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", extra={"roles": "admin"})))


async def test_sub_as_an_int_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", extra={"sub": 1})))


async def test_a_missing_tenant_id_is_unauthenticated(client):
    assert_unauthenticated(await tools_with(client, auth_for("alice", drop=("tenant_id",))))


async def test_a_disabled_tenant_is_refused(client, database_url):
    await db.execute(database_url, sa.update(Tenant).where(Tenant.id == "acme").values(disabled=True))
    assert_error(await tools_with(client, auth_for("alice")), 403, "TENANT_DISABLED")


async def test_the_token_never_appears_in_the_logs(client, logs):
    tokens = [
        make_token("acme", "alice"),
        make_token("acme", "alice", ttl=-10),
        make_token("initech", "alice"),
        make_token("acme", "alice", secret="y" * 48),
    ]
    for token in tokens:
        await tools_with(client, auth(token))
    assert logs.named("authentication_failed")
    for token in tokens:
        assert token not in logs.text
        assert token.split(".")[2] not in logs.text


async def test_the_tenant_and_user_come_from_the_token_not_from_headers(client):
    headers = {**auth_for("alice"), "X-Tenant-ID": "globex", "X-User-ID": "carol"}
    run = (await client.post("/v1/runs", headers=headers)).json()
    assert (run["tenant_id"], run["user_id"]) == ("acme", "alice")


async def test_an_identity_claim_holding_nul_is_unauthenticated(client):
    # Signed or not, such an identity could never be stored (PostgreSQL text cannot hold NUL).
    response = await client.post("/v1/runs", headers=auth_for("alice", extra={"sub": "alice\u0000"}))
    assert_unauthenticated(response)


async def test_a_token_the_provider_issued_for_another_application_is_unauthenticated(client):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", claims(aud="another-client"))
    assert_unauthenticated(await tools_with(client, auth(token)))


@pytest.mark.parametrize("exp", [1e300, 10**400, float("inf"), float("nan")], ids=["1e300", "10**400", "inf", "nan"])
async def test_an_exp_far_in_the_future_or_not_finite_is_unauthenticated_never_a_500(client, exp):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", claims(exp=exp))
    assert_unauthenticated(await tools_with(client, auth(token)))


async def test_a_token_longer_lived_than_the_cap_is_unauthenticated(client):
    now = int(time.time())
    token = signed(ec_key("ec-1"), "ES256", "ec-1", claims(iat=now - 60, exp=now + 86_400))
    assert_unauthenticated(await tools_with(client, auth(token)))


@pytest.mark.parametrize(
    "extra",
    [{"sub": "al\ud800ice"}, {"tenant_id": "ac\udc00me"}, {"nbf": -(10**400)}],
    ids=["surrogate-in-sub", "surrogate-in-tenant", "nbf-past-float-range"],
)
async def test_a_signed_token_with_unstorable_identity_or_absurd_times_is_a_401_not_a_500(client, extra):
    response = await tools_with(client, auth(make_token(extra=extra)))
    assert_error(response, 401, "UNAUTHENTICATED")


def _text_claims(tenant_ids: list[str]) -> str:
    now = int(time.time())
    tenants = "".join(f'"tenant_id":"{tenant}",' for tenant in tenant_ids)
    return (f'{{"sub":"carol",{tenants}"roles":["admin"],"iat":{now},"exp":{now + 600},'
            f'"iss":"{ISSUER}","aud":"{AUDIENCE}"}}')


async def test_a_signed_token_giving_a_claim_twice_is_unauthenticated(client):
    # Which tenant_id wins is undefined in JSON: a proxy reading the first would see globex.
    header = '{"alg":"HS256","typ":"JWT"}'
    for tenants in (["globex", "acme"], ["acme", "globex"], ["acme", "acme"]):
        token = hs256_over_text(tokens.TEST_SECRET, header, _text_claims(tenants))
        assert_unauthenticated(await tools_with(client, auth(token)))
    # the same claims given once each are accepted: it is the repetition that is refused
    assert (await tools_with(client, auth(hs256_over_text(tokens.TEST_SECRET, header, _text_claims(["acme"]))))
            ).status_code == 200


async def test_a_signed_token_whose_header_gives_a_key_twice_is_unauthenticated(client):
    header = '{"alg":"HS256","typ":"JWT","alg":"HS256"}'
    token = hs256_over_text(tokens.TEST_SECRET, header, _text_claims(["acme"]))
    assert_unauthenticated(await tools_with(client, auth(token)))


@pytest.mark.parametrize(
    "extra",
    [{"sub": "alice\n"}, {"sub": "alice\r"}, {"sub": "al\tice"}, {"tenant_id": "acme\n"},
     {"roles": ["admin\n"]}, {"sub": "alice\u2028"}, {"sub": "alice\x1b[31m"}, {"sub": "alice\x85"}],
    ids=["lf-in-sub", "cr-in-sub", "tab-in-sub", "lf-in-tenant", "lf-in-role", "line-separator", "escape", "nel"],
)
async def test_a_signed_token_whose_identity_holds_a_control_character_is_unauthenticated(client, extra):
    response = await client.post("/v1/runs", headers=auth(make_token(extra=extra)))
    assert_unauthenticated(response)
