"""Token verification: HS256 with the secret, RS256/ES256 from a JWKS served over real HTTP;
every way a token can be wrong is refused."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.auth.jwks import JwksCache
from gateway.auth.tokens import InvalidToken, TokenVerifier
from gateway.settings import Settings
from tests.support.keys import (
    claims,
    ec_key,
    hs256_with_raw_key,
    public_jwk,
    public_pem,
    rsa_key,
    signed,
    unsigned,
)
from tests.support.loopback import JwksServer
from tests.support.tokens import TEST_SECRET, make_token


ISSUER, AUDIENCE = "https://id.example", "gateway"


def settings(**overrides) -> Settings:
    return Settings.from_flat(**{"jwt_secret": TEST_SECRET, "jwt_leeway_s": 0, **overrides})


async def refused(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(InvalidToken) as caught:
        await verifier.verify(token)
    return caught.value.reason


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), follow_redirects=False) as client:
        yield client


def jwks_verifier(server: JwksServer, http: httpx.AsyncClient, *, min_refresh_interval_s: float = 10.0, **overrides) -> TokenVerifier:
    config = settings(**{"jwks_url": server.url, "jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, **overrides})
    cache = JwksCache(server.url, http, cache_s=300, timeout_s=5, min_refresh_interval_s=min_refresh_interval_s)
    return TokenVerifier(config, cache)


# --- HS256 with the configured secret ----------------------------------------------------


async def test_a_valid_hs256_token_gives_its_claims():
    verified = await TokenVerifier(settings()).verify(make_token("acme", "bob", ["editor"]))
    assert (verified.sub, verified.tenant_id, verified.roles) == ("bob", "acme", ["editor"])


async def test_an_expired_token_is_refused():
    assert await refused(TokenVerifier(settings()), make_token(ttl=-5)) == "expired"


async def test_exp_is_required():
    assert await refused(TokenVerifier(settings()), make_token(drop=("exp",))) == "invalid"


async def test_nbf_in_the_future_is_refused():
    token = make_token(extra={"nbf": int(time.time()) + 300})
    assert await refused(TokenVerifier(settings()), token) == "not_yet_valid"


async def test_iat_in_the_future_is_refused():
    token = make_token(extra={"iat": int(time.time()) + 300})
    assert await refused(TokenVerifier(settings()), token) == "not_yet_valid"


async def test_leeway_tolerates_small_clock_skew():
    token = make_token(extra={"nbf": int(time.time()) + 5})
    assert (await TokenVerifier(settings(jwt_leeway_s=30)).verify(token)).sub == "alice"


async def test_a_wrong_signature_is_refused():
    token = make_token(secret="another-secret-that-is-long-enough-000000")
    assert await refused(TokenVerifier(settings()), token) == "invalid"


async def test_a_tampered_payload_is_refused():
    header, _, signature = make_token().split(".")
    forged_payload = make_token(user="carol", roles=["admin"]).split(".")[1]
    assert await refused(TokenVerifier(settings()), f"{header}.{forged_payload}.{signature}") == "invalid"


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
async def test_alg_none_is_refused(alg):
    assert await refused(TokenVerifier(settings()), unsigned(claims(), alg)) == "algorithm_not_allowed"


async def test_an_algorithm_off_the_allow_list_is_refused():
    token = make_token(algorithm="HS384")
    assert await refused(TokenVerifier(settings(jwt_algorithms=("HS256",))), token) == "algorithm_not_allowed"


@pytest.mark.parametrize("token", ["", "abc", "a.b", "a.b.c", "....", "Bearer x"])
async def test_a_malformed_token_is_refused(token):
    assert await refused(TokenVerifier(settings()), token) == "malformed"


# --- claims ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"roles": "admin"},
        {"roles": [1, 2]},
        {"roles": None},
        {"sub": 42},
        {"tenant_id": 7},
        {"tenant_id": ["acme"]},
        {"exp": "tomorrow"},
    ],
    ids=["roles-a-string", "roles-not-strings", "roles-null", "sub-an-int", "tenant-an-int", "tenant-a-list", "exp-a-string"],
)
async def test_a_claim_of_the_wrong_type_is_refused(changes):
    assert await refused(TokenVerifier(settings()), make_token(extra=changes)) in ("claim_type", "invalid")


@pytest.mark.parametrize("claim", ["tenant_id", "roles", "sub"])
async def test_a_missing_claim_is_refused(claim):
    assert await refused(TokenVerifier(settings()), make_token(drop=(claim,))) in ("claim_type", "invalid")


@pytest.mark.parametrize(
    "changes",
    [{"sub": ""}, {"tenant_id": ""}, {"roles": [""]}, {"sub": "x" * 129}, {"sub": "a\x00b"}, {"tenant_id": "acme\x00"},
     {"roles": ["member\x00"]}],
)
async def test_an_empty_or_oversized_identity_is_refused(changes):
    assert await refused(TokenVerifier(settings()), make_token(extra=changes)) == "claim_value"


@pytest.mark.parametrize(
    "changes",
    [{"sub": "al\ud800ice"}, {"tenant_id": "ac\udc00me"}, {"roles": ["member", "\udbff"]}],
    ids=["sub", "tenant", "role"],
)
async def test_an_identity_holding_a_lone_surrogate_is_refused(changes):
    assert await refused(TokenVerifier(settings()), make_token(extra=changes)) == "claim_value"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"nbf": -(10**400)}, "claim_value"),
        ({"iat": -(10**400)}, "claim_value"),
        ({"nbf": "1"}, "claim_type"),
        ({"iat": "1"}, "claim_type"),
        ({"iat": True}, "claim_type"),
        ({"nbf": False}, "claim_type"),
    ],
    ids=["nbf-past-float-range", "iat-past-float-range", "nbf-string", "iat-string", "iat-bool", "nbf-bool"],
)
async def test_iat_and_nbf_that_are_not_finite_numbers_are_refused(changes, reason):
    assert await refused(TokenVerifier(settings()), make_token(extra=changes)) == reason


# --- issuer and audience -----------------------------------------------------------------

async def test_iss_and_aud_are_accepted_when_they_match():
    verifier = TokenVerifier(settings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE))
    assert (await verifier.verify(make_token(extra={"iss": ISSUER, "aud": AUDIENCE}))).sub == "alice"


@pytest.mark.parametrize(
    "extra",
    [{"aud": AUDIENCE}, {"iss": "https://evil.example", "aud": AUDIENCE}],
    ids=["iss-missing", "iss-wrong"],
)
async def test_a_configured_issuer_is_enforced(extra):
    verifier = TokenVerifier(settings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE))
    assert await refused(verifier, make_token(extra=extra)) in ("invalid", "wrong_issuer_or_audience")


@pytest.mark.parametrize(
    "extra",
    [{"iss": ISSUER}, {"iss": ISSUER, "aud": "another-service"}, {"iss": ISSUER, "aud": ["another-service"]}],
    ids=["aud-missing", "aud-wrong", "aud-list-without-us"],
)
async def test_a_configured_audience_is_enforced(extra):
    verifier = TokenVerifier(settings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE))
    assert await refused(verifier, make_token(extra=extra)) in ("invalid", "wrong_issuer_or_audience")


async def test_iss_and_aud_are_ignored_when_not_configured():
    assert (await TokenVerifier(settings()).verify(make_token(extra={"iss": "x", "aud": "y"}))).sub == "alice"


# --- RS256 / ES256 from a JWKS -----------------------------------------------------------


def idp_claims(**changes) -> dict:
    """Claims as the identity provider issues them for this gateway (JWKS mode needs iss and aud)."""
    return claims(**{"iss": ISSUER, "aud": AUDIENCE, **changes})


async def test_an_rs256_token_is_verified_with_the_jwks_key(jwks_server, http):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims(user="bob"))
    assert (await jwks_verifier(jwks_server, http).verify(token)).sub == "bob"


async def test_an_es256_token_is_verified_with_the_jwks_key(jwks_server, http):
    token = signed(ec_key("ec-1"), "ES256", "ec-1", idp_claims(user="carol"))
    assert (await jwks_verifier(jwks_server, http).verify(token)).sub == "carol"


async def test_jwks_keys_are_cached(jwks_server, http):
    verifier = jwks_verifier(jwks_server, http)
    for user in ("u1", "u2", "u3"):
        await verifier.verify(signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims(user=user)))
    await verifier.verify(signed(ec_key("ec-1"), "ES256", "ec-1", idp_claims(user="u4")))
    assert jwks_server.fetches == 1


async def test_an_unknown_kid_refreshes_the_keys_for_a_rotation(jwks_server, http):
    verifier = jwks_verifier(jwks_server, http, min_refresh_interval_s=0)
    await verifier.verify(signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims()))
    jwks_server.keys = [public_jwk("rsa-2", rsa_key("rsa-2"), "RS256")]  # the provider rotates
    token = signed(rsa_key("rsa-2"), "RS256", "rsa-2", idp_claims(user="after-rotation"))
    assert (await verifier.verify(token)).sub == "after-rotation"
    assert jwks_server.fetches == 2


async def test_unknown_kids_refresh_at_most_once_per_interval(jwks_server, http):
    verifier = jwks_verifier(jwks_server, http, min_refresh_interval_s=3600)
    await verifier.verify(signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims()))
    for n in range(5):
        token = signed(rsa_key("rsa-1"), "RS256", f"made-up-{n}", idp_claims())
        assert await refused(verifier, token) == "unknown_kid"
    assert jwks_server.fetches == 1


async def test_a_token_without_kid_is_refused_for_jwks_algorithms(jwks_server, http):
    token = signed(rsa_key("rsa-1"), "RS256", None, idp_claims())
    assert await refused(jwks_verifier(jwks_server, http), token) == "unknown_kid"


async def test_a_token_signed_by_a_key_not_in_the_jwks_is_refused(jwks_server, http):
    token = signed(rsa_key("attacker"), "RS256", "rsa-1", idp_claims())
    assert await refused(jwks_verifier(jwks_server, http), token) == "invalid"


async def test_a_key_of_another_family_is_refused(jwks_server, http):
    token = signed(rsa_key("rsa-1"), "RS256", "ec-1", idp_claims())
    assert await refused(jwks_verifier(jwks_server, http), token) == "key_algorithm_mismatch"


@pytest.mark.parametrize("algorithm", ["RS384", "PS256"])
async def test_an_rsa_key_without_alg_verifies_every_allowed_rsa_algorithm(jwks_server, http, algorithm):
    """A review's find: PyJWT reads an RSA key without `alg` as RS256, so an identity provider
    whose JWKS omits `alg` (many do) could not sign RS384 or PS256 tokens the settings allow."""
    jwk = public_jwk("rsa-bare", rsa_key("rsa-bare"), "RS256")
    del jwk["alg"]
    jwks_server.keys = [jwk]
    verifier = jwks_verifier(jwks_server, http, jwt_algorithms=("RS256", "RS384", "PS256"))
    token = signed(rsa_key("rsa-bare"), algorithm, "rsa-bare", idp_claims(user="bare"))
    assert (await verifier.verify(token)).sub == "bare"


async def test_a_key_that_names_its_alg_verifies_that_one_only(jwks_server, http):
    verifier = jwks_verifier(jwks_server, http, jwt_algorithms=("RS256", "RS384"))
    token = signed(rsa_key("rsa-1"), "RS384", "rsa-1", idp_claims())  # rsa-1 is published as RS256
    assert await refused(verifier, token) == "key_algorithm_mismatch"


async def test_an_hs256_token_signed_with_the_rsa_public_key_is_refused(jwks_server, http):
    """Algorithm confusion: the attacker knows the public key and uses it as an HMAC secret."""
    token = hs256_with_raw_key(public_pem(rsa_key("rsa-1")), idp_claims(roles=["admin"]), kid="rsa-1")
    assert await refused(jwks_verifier(jwks_server, http), token) == "invalid"
    without_secret = jwks_verifier(jwks_server, http, jwt_secret=None)
    assert await refused(without_secret, token) == "no_secret_configured"


async def test_rs256_is_refused_without_a_jwks():
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims())
    assert await refused(TokenVerifier(settings()), token) == "no_jwks_configured"


async def test_an_unreachable_jwks_refuses_the_token_without_raising_anything_else(http):
    cache = JwksCache("http://127.0.0.1:9/jwks", http, cache_s=300, timeout_s=1)
    verifier = TokenVerifier(settings(jwks_url="http://127.0.0.1:9/jwks", jwt_issuer=ISSUER, jwt_audience=AUDIENCE), cache)
    assert await refused(verifier, signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims())) == "unknown_kid"


# --- production defaults: audience, issuer and lifetime ----------------------------------


async def test_a_token_the_provider_issued_for_another_application_is_refused(jwks_server, http):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims(aud="another-client"))
    assert await refused(jwks_verifier(jwks_server, http), token) == "wrong_issuer_or_audience"


async def test_a_token_of_another_issuer_signed_with_a_known_key_is_refused(jwks_server, http):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims(iss="https://other-tenant.id.example"))
    assert await refused(jwks_verifier(jwks_server, http), token) == "wrong_issuer_or_audience"


@pytest.mark.parametrize("exp", [1e300, 10**400, 2**63], ids=["1e300", "10**400", "2**63"])
async def test_an_exp_far_in_the_future_is_refused(jwks_server, http, exp):
    token = signed(rsa_key("rsa-1"), "RS256", "rsa-1", idp_claims(exp=exp))
    assert await refused(jwks_verifier(jwks_server, http), token) == "lifetime_too_long"


@pytest.mark.parametrize("exp", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
async def test_a_non_finite_exp_is_refused(exp):
    assert await refused(TokenVerifier(settings()), make_token(extra={"exp": exp})) in ("invalid", "expired")


async def test_the_lifetime_is_exp_minus_iat():
    verifier = TokenVerifier(settings(jwt_max_lifetime_s=3600))
    now = int(time.time())
    assert (await verifier.verify(make_token(extra={"iat": now - 3000, "exp": now + 600}))).sub == "alice"
    too_long = make_token(extra={"iat": now - 3000, "exp": now + 601})
    assert await refused(verifier, too_long) == "lifetime_too_long"


async def test_without_iat_the_lifetime_is_counted_from_now():
    verifier = TokenVerifier(settings(jwt_max_lifetime_s=3600))
    assert (await verifier.verify(make_token(ttl=1800, drop=("iat",)))).sub == "alice"
    assert await refused(verifier, make_token(ttl=7200, drop=("iat",))) == "lifetime_too_long"


async def test_the_default_lifetime_is_a_day():
    verifier = TokenVerifier(settings())
    assert (await verifier.verify(make_token(ttl=86_400))).sub == "alice"
    assert await refused(verifier, make_token(ttl=86_400 + 60)) == "lifetime_too_long"
