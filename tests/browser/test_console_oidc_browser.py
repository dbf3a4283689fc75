"""OpenID Connect sign-in in a real browser: the console sends Chromium to the provider (a
real one on a loopback port), which sends it back with a code; the browser ends up signed in."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import serve
from tests.support.oidc_provider import OidcProvider
from tests.support.processes import GatewayProcess


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    with OidcProvider(user="carol", roles=["admin"]) as running:
        yield running


@pytest.fixture(scope="module")
def oidc_gateway(browser_db: str, provider: OidcProvider) -> Iterator[GatewayProcess]:
    yield from serve(browser_db, **provider.settings())


def test_sign_in_through_the_providers_redirects(page: Page, oidc_gateway: GatewayProcess, provider: OidcProvider) -> None:
    page.goto(f"{oidc_gateway.url}/console/")
    expect(page).to_have_url(re.compile(r"/console/sign-in$"))
    expect(page.get_by_label("Access token")).to_have_count(0)
    page.get_by_role("link", name="Sign in with your identity provider").click()
    expect(page).to_have_url(re.compile(r"/console/approvals$"))
    expect(page.get_by_text("carol · acme")).to_be_visible()
    assert provider.authorize_requests[-1]["code_challenge_method"] == "S256"
    assert provider.token_requests[-1]["code_verifier"]
