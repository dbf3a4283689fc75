"""Tokens the gateway signs for business services, and the JWKS that verifies them."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from litestar.testing import AsyncTestClient

from gateway import cli
from gateway.app import create_app
from gateway.auth.middleware import PUBLIC_PATHS
from gateway.auth.principal import Principal
from gateway.auth.service_tokens import ServiceTokenSigner, load_service_signer
from gateway.settings import Settings, SettingsError
from tests.conftest import make_settings
from tests.support.tokens import SERVICE_SIGNING_KEY

BOB = Principal(tenant_id="acme", user_id="bob", roles=frozenset({"editor", "member"}), permissions=frozenset())


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def verify(signer: ServiceTokenSigner, token: str, audience: str = "orders") -> dict:
    keyset = jwt.PyJWKSet.from_dict(signer.jwks())
    key = keyset[jwt.get_unverified_header(token)["kid"]]
    return jwt.decode(token, key.key, algorithms=[signer.algorithm], audience=audience, issuer="gateway",
                      options={"require": ["exp", "iat", "sub", "aud", "iss"]})


@pytest.mark.parametrize(
    ("key", "algorithm"),
    [(ec.generate_private_key(ec.SECP256R1()), "ES256"), (rsa.generate_private_key(65537, 2048), "RS256")],
)
def test_token_carries_the_caller_and_the_call_for_one_service(key, algorithm: str):
    signer = load_service_signer(Settings.from_flat(service_signing_key=pem(key), service_token_ttl_s=45))
    assert signer is not None and signer.algorithm == algorithm
    token = signer.sign(BOB, audience="orders", run_id="run_1", tool_call_id="call_1")
    claims = verify(signer, token)
    assert {k: claims[k] for k in ("sub", "tenant_id", "roles", "run_id", "tool_call_id", "aud")} == {
        "sub": "bob", "tenant_id": "acme", "roles": ["editor", "member"], "run_id": "run_1",
        "tool_call_id": "call_1", "aud": "orders",
    }
    assert claims["exp"] - claims["iat"] == 45
    with pytest.raises(jwt.InvalidAudienceError):
        verify(signer, token, audience="billing")


def test_every_token_is_unique():
    signer = load_service_signer(Settings.from_flat(service_signing_key=SERVICE_SIGNING_KEY))
    assert signer is not None
    first, second = (signer.sign(BOB, audience="orders", run_id="r", tool_call_id="c") for _ in range(2))
    assert verify(signer, first)["jti"] != verify(signer, second)["jti"]


def test_key_id_names_the_key_so_every_process_agrees(tmp_path: Path):
    path = tmp_path / "key.pem"
    path.write_text(SERVICE_SIGNING_KEY)
    from_file = load_service_signer(Settings.from_flat(service_signing_key_file=str(path)))
    from_env = load_service_signer(Settings.from_flat(service_signing_key=SERVICE_SIGNING_KEY.replace("\n", "\\n")))
    assert from_file is not None and from_env is not None
    assert from_file.key_id == from_env.key_id
    (public,) = from_file.jwks()["keys"]
    assert public["kid"] == from_file.key_id and "d" not in public


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (Settings.from_flat(
            service_signing_key="-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----"),
         "not an unencrypted PEM private key"),
        (Settings.from_flat(service_signing_key=pem(ec.generate_private_key(ec.SECP384R1()))), "P-256"),
        (Settings.from_flat(service_signing_key=pem(rsa.generate_private_key(65537, 1024))), "2048"),
        (Settings.from_flat(service_signing_key=SERVICE_SIGNING_KEY, service_signing_key_file="/x.pem"), "not both"),
        (Settings.from_flat(service_signing_key_file="/nonexistent/key.pem"), "cannot be read"),
    ],
)
def test_unusable_keys_stop_start_up_without_showing_the_key(settings: Settings, why: str):
    with pytest.raises(SettingsError, match=why) as error:
        load_service_signer(settings)
    assert "c2VjcmV0" not in str(error.value) and "BEGIN" not in str(error.value)


def test_demo_mode_generates_a_signing_key_and_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("GATEWAY_")]:
        monkeypatch.delenv(name)
    # load_settings writes these into the environment: register them so they are undone.
    for name in ("GATEWAY_JWT_SECRET", "GATEWAY_DEMO", "GATEWAY_SERVICE_SIGNING_KEY_FILE"):
        monkeypatch.setenv(name, "")
    first = load_service_signer(cli.load_settings(demo=True))
    path = tmp_path / cli.DEMO_SIGNING_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setenv("GATEWAY_SERVICE_SIGNING_KEY_FILE", "")
    second = load_service_signer(cli.load_settings(demo=True))
    assert first is not None and second is not None and first.key_id == second.key_id


@pytest.mark.parametrize(
    ("path", "public"),
    [
        ("/.well-known/jwks.json", True),
        ("/v1/runs/.well-known/jwks.json", False),
        ("/.well-known/jwks.json/x", False),
        ("/.well-knownxjwks.json", False),
        ("/.well-known/jwksxjson", False),
    ],
)
def test_only_the_jwks_path_itself_is_public(path: str, public: bool):
    # Litestar matches exclude patterns anywhere in the path (re.search).
    assert bool(re.compile("|".join(PUBLIC_PATHS)).search(path)) is public


async def test_jwks_route_needs_no_token_and_is_empty_without_a_key(pg_url: str):
    async with AsyncTestClient(app=create_app(make_settings(pg_url))) as client:
        response = await client.get("/.well-known/jwks.json")
        assert response.status_code == 200
        assert response.json() == {"keys": []}
    with_key = create_app(make_settings(pg_url, service_signing_key=SERVICE_SIGNING_KEY))
    async with AsyncTestClient(app=with_key) as client:
        (key,) = (await client.get("/.well-known/jwks.json")).json()["keys"]
        assert key["alg"] == "ES256"
        assert "/.well-known/jwks.json" in (await client.get("/schema/openapi.json")).json()["paths"]
