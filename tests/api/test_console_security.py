"""The console's defences over HTTP: security headers, cookie flags, CSRF, session limits,
sign-out, and hostile form input. The app behind the test client, on PostgreSQL."""

from __future__ import annotations

import asyncio
import re

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.console.routes import CONSOLE_PATHS
from tests.support import db
from tests.support.app import make_settings
from tests.support.approvals import request_approval
from tests.support.calls import create_run
from tests.support.console import csrf_of, page_csrf, sign_in
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")


@pytest.fixture(autouse=True)
def no_redirects(pg_client):
    pg_client.follow_redirects = False


@pytest.fixture
async def pending(pg_client):
    run = await create_run(pg_client, BOB)
    return await request_approval(pg_client, run["id"], BOB, "n1", "write_note", {"text": "hello"})


async def status_of(url: str, approval_id: str) -> str:
    (row,) = await db.approvals(url, id=approval_id)
    return row.status


def assert_secure_headers(response) -> None:
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"


async def test_pages_and_refusals_send_the_security_headers(pg_client):
    assert_secure_headers(await pg_client.get("/console/sign-in"))
    assert_secure_headers(await pg_client.get("/console/approvals"))  # the redirect to sign-in
    assert_secure_headers(await pg_client.post("/console/sign-out", data={}))  # refused: no session
    await sign_in(pg_client)
    assert_secure_headers(await pg_client.get("/console/approvals"))
    assert_secure_headers(await pg_client.get("/console/approvals/no-such-approval"))


async def test_pages_load_nothing_from_another_origin_and_run_no_inline_script(pg_client):
    await sign_in(pg_client)
    html = (await pg_client.get("/console/approvals")).text
    assert "<script" not in html and "http://" not in html and "https://" not in html and "style=" not in html


async def test_the_stylesheet_is_served_from_the_package(pg_client):
    response = await pg_client.get("/console/static/console.css")
    assert response.status_code == 200 and "text/css" in response.headers["content-type"]


async def test_the_cookie_is_secure_when_the_setting_says_so(seeded_pg_url):
    app = create_app(make_settings(seeded_pg_url, console_secure_cookie="always"))
    async with AsyncTestClient(app=app) as client:
        client.follow_redirects = False
        form = await client.get("/console/sign-in")
        assert "secure" in form.headers["set-cookie"].lower()


async def test_an_approve_posted_without_the_csrf_token_is_refused(pg_client, seeded_pg_url, pending):
    await sign_in(pg_client)
    response = await pg_client.post(f"/console/approvals/{pending}/approve", data={})
    assert response.status_code == 403 and "did not come from this console" in response.text
    wrong = await pg_client.post(f"/console/approvals/{pending}/approve", data={"csrf_token": "x" * 43})
    assert wrong.status_code == 403
    assert await status_of(seeded_pg_url, pending) == "pending"


async def test_a_csrf_token_of_another_session_is_refused(pg_client, seeded_pg_url, pending):
    await sign_in(pg_client)
    first = await page_csrf(pg_client)
    pg_client.cookies.clear()
    await sign_in(pg_client)
    response = await pg_client.post(f"/console/approvals/{pending}/approve", data={"csrf_token": first})
    assert response.status_code == 403
    assert await status_of(seeded_pg_url, pending) == "pending"


async def test_a_post_without_a_session_is_a_403_not_a_redirect(pg_client, pending):
    response = await pg_client.post(f"/console/approvals/{pending}/approve", data={"csrf_token": "x"})
    assert response.status_code == 403


async def test_options_and_head_on_console_pages_never_fail(pg_client, pending):
    for path in ("/console/", "/console/approvals", f"/console/approvals/{pending}", "/console/sign-in"):
        options = await pg_client.options(path)
        assert options.status_code < 500, (path, options.status_code)
        head = await pg_client.head(path)
        assert head.status_code < 500, (path, head.status_code)


async def test_the_bearer_middleware_is_not_fooled_by_a_console_like_path(pg_client):
    response = await pg_client.get("/v1/approvals/console")
    assert response.status_code == 401
    for path in ("/consoles", "/v1/console", "/v1/x/console/y", "/console-admin"):
        assert re.search(CONSOLE_PATHS, path) is None, path
    for path in ("/console", "/console/", "/console/approvals"):
        assert re.search(CONSOLE_PATHS, path) is not None, path


async def test_sign_out_ends_the_session_and_the_old_cookie_no_longer_works(pg_client):
    await sign_in(pg_client)
    old = pg_client.cookies.get("gateway_console")
    csrf = await page_csrf(pg_client)
    response = await pg_client.post("/console/sign-out", data={"csrf_token": csrf})
    assert response.status_code == 303 and response.headers["location"] == "/console/sign-in"
    pg_client.cookies.set("gateway_console", old, path="/console")
    again = await pg_client.get("/console/approvals")
    assert again.status_code == 303 and again.headers["location"] == "/console/sign-in"


async def test_sign_out_while_the_tenant_is_disabled_still_ends_the_session(pg_client, seeded_pg_url):
    """A review's reproduction: sign-out rebuilt the user first, which a disabled tenant
    refuses; the session stayed, and worked again once the tenant was enabled."""
    import sqlalchemy as sa

    from gateway.db.models import Tenant
    from gateway.wiring import services_of

    await sign_in(pg_client)
    old = pg_client.cookies.get("gateway_console")
    csrf = await page_csrf(pg_client)
    await db.execute(seeded_pg_url, sa.update(Tenant).where(Tenant.id == "acme").values(disabled=True))
    services_of(pg_client.app).tenant_directory.invalidate()
    response = await pg_client.post("/console/sign-out", data={"csrf_token": csrf})
    assert response.status_code == 303 and response.headers["location"] == "/console/sign-in"
    assert "gateway_console=" in response.headers["set-cookie"] and "Max-Age=0" in response.headers["set-cookie"]

    await db.execute(seeded_pg_url, sa.update(Tenant).where(Tenant.id == "acme").values(disabled=False))
    services_of(pg_client.app).tenant_directory.invalidate()
    pg_client.cookies.set("gateway_console", old, path="/console")
    again = await pg_client.get("/console/approvals")
    assert again.status_code == 303 and again.headers["location"] == "/console/sign-in"


async def test_sign_out_without_the_sessions_csrf_token_ends_nothing(pg_client):
    await sign_in(pg_client)
    refused = await pg_client.post("/console/sign-out", data={"csrf_token": "forged"})
    assert refused.status_code == 403
    assert (await pg_client.get("/console/approvals")).status_code == 200


@pytest.mark.parametrize(
    ("overrides", "keep_using"),
    [({"console_session_idle_s": 1}, False), ({"console_session_max_s": 1}, True)],
    ids=["idle", "absolute"],
)
async def test_a_session_ends_after_its_idle_or_absolute_limit(seeded_pg_url, overrides, keep_using):
    app = create_app(make_settings(seeded_pg_url, **overrides))
    async with AsyncTestClient(app=app) as client:
        client.follow_redirects = False
        await sign_in(client)
        assert (await client.get("/console/approvals")).status_code == 200
        for _ in range(3 if keep_using else 1):  # use keeps an idle session alive, not an old one
            await asyncio.sleep(0.4 if keep_using else 1.1)
            await client.get("/console/approvals")
        assert (await client.get("/console/approvals")).status_code == 303


async def test_a_forged_cookie_value_is_no_session(pg_client):
    for value in ("x" * 43, "a" * 5000, "../../etc", "%00"):
        pg_client.cookies.set("gateway_console", value, path="/console")
        response = await pg_client.get("/console/approvals")
        assert response.status_code == 303, value


async def test_hostile_form_fields_are_refused_and_nothing_is_decided(pg_client, seeded_pg_url, pending):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client)
    for reason in ("bad\x00reason", "r" * 20_000):
        response = await pg_client.post(
            f"/console/approvals/{pending}/reject", data={"csrf_token": csrf, "reason": reason}
        )
        assert response.status_code in (400, 403) and "text/html" in response.headers["content-type"]
    doubled = await pg_client.post(
        f"/console/approvals/{pending}/reject", content=f"csrf_token={csrf}&reason=a&reason=b",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert doubled.status_code == 403
    assert await status_of(seeded_pg_url, pending) == "pending"


async def test_a_token_with_a_nul_byte_or_huge_is_refused_without_a_500(pg_client):
    for token in ("eyJ\x00abc", "a" * 20_000):
        form = await pg_client.get("/console/sign-in")
        response = await pg_client.post("/console/sign-in", data={"csrf_token": csrf_of(form.text), "token": token})
        assert response.status_code in (400, 401, 403), response.status_code


@pytest.mark.parametrize("approval_id", ["no-such-approval", "bad%00id", "x" * 300, "%E2%80%AE"])
async def test_unknown_or_malformed_approval_ids_are_a_404_page(pg_client, approval_id):
    await sign_in(pg_client)
    response = await pg_client.get(f"/console/approvals/{approval_id}")
    assert response.status_code in (400, 404) and "text/html" in response.headers["content-type"]
    csrf = await page_csrf(pg_client)
    posted = await pg_client.post(f"/console/approvals/{approval_id}/approve", data={"csrf_token": csrf})
    assert posted.status_code in (400, 404)


async def test_another_tenants_approval_cannot_be_decided(pg_client, seeded_pg_url, pending):
    await sign_in(pg_client, "carol", tenant="globex")
    csrf = await page_csrf(pg_client)
    response = await pg_client.post(f"/console/approvals/{pending}/approve", data={"csrf_token": csrf})
    assert response.status_code == 404 and "Not found" in response.text
    assert await status_of(seeded_pg_url, pending) == "pending"


async def test_an_unreachable_database_is_a_503_page_that_leaks_nothing():
    from tests.support.loopback import free_port

    url = f"postgresql+asyncpg://gateway:pw@127.0.0.1:{free_port()}/gateway"
    app = create_app(make_settings(url, database_pool_timeout_s=1.0))
    async with AsyncTestClient(app=app) as client:
        client.follow_redirects = False
        client.cookies.set("gateway_console", "a" * 43, path="/console")
        response = await client.get("/console/approvals")
        assert response.status_code == 503 and "text/html" in response.headers["content-type"]
        assert "127.0.0.1" not in response.text and "gateway:pw" not in response.text
        assert_secure_headers(response)


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=", "application/json", "text/plain",
     "application/x-www-form-urlencoded; charset=nope"],
)
async def test_a_form_posted_in_an_odd_encoding_gets_a_page_never_json_or_a_500(pg_client, content_type):
    form = await pg_client.get("/console/sign-in")
    csrf = csrf_of(form.text)
    body = (f'--b\r\nContent-Disposition: form-data; name="csrf_token"\r\n\r\n{csrf}\r\n--b--\r\n'
            if content_type.startswith("multipart") else f"csrf_token={csrf}&token=abc")
    response = await pg_client.post("/console/sign-in", content=body, headers={"Content-Type": content_type})
    assert response.status_code in (400, 401, 403), (response.status_code, response.text[:200])
    assert "text/html" in response.headers["content-type"], response.text[:200]
    assert_secure_headers(response)


async def test_bidirectional_controls_in_what_a_page_shows_are_written_as_escapes(pg_client):
    """A review's reproduction: a model's argument "\\u202e00001" read as 10000 on the approval
    page, and a path as one ending in .jpg."""
    reordering = "\u202e00001 \u2066x\u2069 \u200b"
    run = await create_run(pg_client, BOB)
    approval_id = await request_approval(pg_client, run["id"], BOB, "bidi", "write_note", {"text": reordering})
    await sign_in(pg_client)
    for path in ("/console/approvals", f"/console/approvals/{approval_id}"):
        page = await pg_client.get(path)
        assert page.status_code == 200
        for char in "\u202e\u2066\u2069\u200b":
            assert char not in page.text, (path, hex(ord(char)))
    assert "\\u202e00001" in page.text
