"""OPTIONS on every route of the app: CORS is off, so OPTIONS is authenticated like any
method. Without a token a protected route answers 401, a public one 204; never a 5xx, and
nothing unauthenticated writes a traceback."""

from __future__ import annotations

import re

import pytest
from litestar.routes import HTTPRoute

from gateway.auth.middleware import PUBLIC_PATHS
from tests.support.http import assert_error
from tests.support.tokens import auth_for

PATH_PARAMETER = re.compile(r"\{[^}]+\}")


def concrete(path: str) -> str:
    return PATH_PARAMETER.sub("x1", path)


def is_public(path: str) -> bool:
    return any(re.search(pattern, path) for pattern in PUBLIC_PATHS)


def http_paths(client) -> list[str]:
    paths = [concrete(route.path) for route in client.app.routes if isinstance(route, HTTPRoute)]
    assert any(path.startswith("/v1/admin/") for path in paths)
    return paths


async def test_options_without_a_token_is_401_on_protected_routes_and_204_on_public_ones(pg_client, logs):
    for path in http_paths(pg_client):
        response = await pg_client.options(path)
        if is_public(path):
            assert response.status_code == 204, (path, response.text)
        else:
            assert_error(response, 401, "UNAUTHENTICATED")
    assert not [event for event in logs.events if "exception" in event or "exc_info" in event]


@pytest.mark.parametrize("user", ["carol", "alice"], ids=["admin", "member"])
async def test_options_with_a_token_is_never_a_server_error(pg_client, logs, user):
    for path in http_paths(pg_client):
        response = await pg_client.options(path, headers=auth_for(user))
        assert response.status_code in (204, 403), (path, response.status_code, response.text)
    assert not [event for event in logs.events if "exception" in event or "exc_info" in event]
