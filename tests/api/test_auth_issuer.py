"""With GATEWAY_JWT_ISSUER and GATEWAY_JWT_AUDIENCE set, tokens must carry both."""

from __future__ import annotations

import pytest

from tests.support.http import assert_error
from tests.support.tokens import auth_for

ISSUER, AUDIENCE = "https://id.acme.example", "gateway"


@pytest.fixture
def settings_overrides():
    return {"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE}


async def test_a_token_with_the_configured_iss_and_aud_is_accepted(client):
    response = await client.get("/v1/tools", headers=auth_for(extra={"iss": ISSUER, "aud": AUDIENCE}))
    assert response.status_code == 200


@pytest.mark.parametrize(
    "extra",
    [
        {"aud": AUDIENCE},
        {"iss": "https://evil.example", "aud": AUDIENCE},
        {"iss": ISSUER},
        {"iss": ISSUER, "aud": "billing"},
    ],
    ids=["iss-missing", "iss-wrong", "aud-missing", "aud-wrong"],
)
async def test_a_token_without_the_configured_iss_or_aud_is_unauthenticated(client, extra):
    assert_error(await client.get("/v1/tools", headers=auth_for(extra=extra)), 401, "UNAUTHENTICATED")
