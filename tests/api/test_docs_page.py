"""The documentation page works without internet: everything it loads comes from the gateway."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from gateway.api.docs import ASSETS

pytestmark = pytest.mark.postgres


class References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.urls.append(value)


async def test_the_page_references_only_same_origin_urls(pg_client) -> None:
    response = await pg_client.get("/schema")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = References()
    page.feed(response.text)
    assert {"/schema/assets/swagger-ui-bundle.js", "/schema/assets/swagger-ui.css"} <= set(page.urls)
    for url in page.urls:
        assert url.startswith("/") and not url.startswith("//"), url
    assert not re.search(r"https?://|//cdn|unpkg|jsdelivr", response.text.split("spec:")[0])


@pytest.mark.parametrize("name", sorted(ASSETS))
async def test_each_asset_is_served_by_the_gateway_without_a_token(pg_client, name: str) -> None:
    response = await pg_client.get(f"/schema/assets/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"].split(";")[0] == ASSETS[name]
    assert response.headers["content-type"].count("charset") <= 1
    assert len(response.content) > 100


async def test_the_bundle_is_swagger_ui_and_its_license_is_served(pg_client) -> None:
    bundle = await pg_client.get("/schema/assets/swagger-ui-bundle.js")
    assert b"SwaggerUIBundle" in bundle.content
    license_text = await pg_client.get("/schema/assets/LICENSE")
    assert "Apache License" in license_text.text


@pytest.mark.parametrize("name", ["swagger-ui-editor.js", "..%2Fcore.py", "index.html", "swagger-ui-bundle.js.map"])
async def test_nothing_else_of_the_package_is_served(pg_client, name: str) -> None:
    response = await pg_client.get(f"/schema/assets/{name}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"
