"""Driving the console as a browser would, over HTTP: sign in with a token, read a page's
CSRF token, post its forms."""

from __future__ import annotations

import re
from typing import Any

from tests.support.tokens import make_token

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match is not None, html[:2000]
    return match.group(1)


async def sign_in(client: Any, user: str = "carol", tenant: str = "acme", **token: Any) -> Any:
    """Signs ``client`` in (its cookie jar keeps the session); answers the response of the sign-in post."""
    form = await client.get("/console/sign-in")
    assert form.status_code == 200, form.text
    response = await client.post(
        "/console/sign-in", data={"csrf_token": csrf_of(form.text), "token": make_token(tenant, user, **token)}
    )
    assert response.status_code == 303, response.text
    return response


async def page_csrf(client: Any, path: str = "/console/approvals") -> str:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    return csrf_of(response.text)
