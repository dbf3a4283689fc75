"""Signing in and out of the console.

Without an OpenID Connect provider the sign-in page takes a token (development and demo):
it goes through the same ``TokenVerifier`` and tenant directory as a bearer token on the
API, is used once to start a session, and is never stored, echoed or put in a URL. The
sign-in form carries its own CSRF token, bound to a short-lived cookie of the sign-in page.
"""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Request, Response, get, post
from litestar.datastructures import Cookie

from gateway.auth.tokens import InvalidToken
from gateway.console.oidc import SIGN_IN_TTL_S, SignInFailed
from gateway.errors import ErrorCode, GatewayError
from gateway.console.sessions import new_secret, well_formed
from gateway.console.web import (
    COOKIE,
    PREFIX,
    SIGN_IN,
    checked_form,
    cleared_cookie,
    page,
    redirect,
    secure_cookie,
    services_of,
    session_cookie,
    session_store,
    signed_in,
    SignInRequired,
)

log = structlog.get_logger("gateway.console")

SIGN_IN_COOKIE = "gateway_console_sign_in"
OIDC_COOKIE = "gateway_console_oidc"
"""Binds a sign-in at the provider to the browser that started it. ``SameSite=Lax``: the
browser comes back from the provider's site, and a ``Strict`` cookie would stay behind."""
CALLBACK = f"{PREFIX}/oidc/callback"
SIGN_IN_FORM_S = 900


def sign_in_cookie(request: Request[Any, Any, Any], value: str, *, max_age: int = SIGN_IN_FORM_S) -> Cookie:
    return Cookie(key=SIGN_IN_COOKIE, value=value, path=PREFIX, httponly=True, samesite="strict",
                  secure=secure_cookie(request, services_of(request)), max_age=max_age)


def sign_in_page(request: Request[Any, Any, Any], *, status: int = 200, error: str | None = None) -> Response[str]:
    services = services_of(request)
    value = new_secret()
    return page(
        "sign_in.html", status=status, error=error, form_token=value, oidc=services.settings.oidc.enabled,
        cookies=[sign_in_cookie(request, value)],
    )


async def start_session(
    request: Request[Any, Any, Any], *, tenant_id: str, user_id: str, roles: list[str], via: str = "token"
) -> Response[Any]:
    services = services_of(request)
    store = session_store(services)
    await store.end(request.cookies.get(COOKIE))  # a browser signing in again leaves no session behind
    value, _ = await store.create(tenant_id=tenant_id, user_id=user_id, roles=roles)
    log.info("console_signed_in", tenant=tenant_id, user=user_id, via=via)
    max_age = services.settings.console.session_max_s
    cookies = [session_cookie(request, services, value, max_age=max_age), sign_in_cookie(request, "", max_age=0)]
    if via == "oidc":
        # Arriving from the provider's site, a redirect would still be a cross-site navigation
        # and the browser would hold the new SameSite=Strict cookie back: this page moves on
        # from our own origin (a meta refresh, no script), where the cookie is sent.
        return page("signed_in.html", cookies=cookies)
    return redirect(f"{PREFIX}/approvals", cookies=cookies)


def oidc_cookie(request: Request[Any, Any, Any], value: str, *, max_age: int) -> Cookie:
    return Cookie(key=OIDC_COOKIE, value=value, path=f"{PREFIX}/oidc", httponly=True, samesite="lax",
                  secure=secure_cookie(request, services_of(request)), max_age=max_age)


def callback_url(request: Request[Any, Any, Any]) -> str:
    return str(request.base_url).rstrip("/") + CALLBACK


def oidc_client(request: Request[Any, Any, Any]) -> Any:
    client = services_of(request).console_oidc
    if client is None:
        raise GatewayError(ErrorCode.NOT_FOUND, "Sign-in with an identity provider is not configured.")
    return client


@get("/oidc/start", include_in_schema=False)
async def oidc_start(request: Request) -> Response[Any]:
    """Off to the provider's sign-in page, with state, nonce and a PKCE challenge."""
    client = oidc_client(request)
    try:
        started = await client.start(callback_url(request))
    except SignInFailed as exc:
        log.warning("console_oidc_start_failed", reason=exc.reason)
        return sign_in_page(request, status=503, error="The identity provider cannot be reached. Try again later.")
    return redirect(started.redirect_to,
                    cookies=[oidc_cookie(request, started.browser_value, max_age=SIGN_IN_TTL_S)])


@get("/oidc/callback", include_in_schema=False)
async def oidc_callback(request: Request) -> Response[Any]:
    """Back from the provider: the code is exchanged, the ID token verified like an API token.
    Every answer it gives clears the sign-in's cookie, so a sign-in is tried once (on a failure
    of the gateway itself the cookie stays, but the provider redeems the code only once)."""
    client = oidc_client(request)
    response = await _finish_oidc(request, client)
    response.set_cookie(oidc_cookie(request, "", max_age=0))
    return response


async def _finish_oidc(request: Request[Any, Any, Any], client: Any) -> Response[Any]:
    params = request.query_params
    if params.get("error"):
        log.info("console_sign_in_refused", reason="provider_error")
        return sign_in_page(request, status=401, error="The identity provider did not sign you in.")
    try:
        claims = await client.finish(
            state=params.get("state", ""), code=params.get("code", ""),
            browser_value=request.cookies.get(OIDC_COOKIE), redirect_uri=callback_url(request),
        )
    except SignInFailed as exc:
        log.info("console_sign_in_refused", reason=exc.reason)
        return sign_in_page(request, status=401, error="The sign-in could not be completed. Start again.")
    directory = services_of(request).tenant_directory
    principal = await directory.principal(claims.tenant_id, claims.sub, claims.roles)
    if principal is None or directory.is_disabled(principal.tenant_id):
        log.info("console_sign_in_refused", reason="unknown_or_disabled_tenant")
        return sign_in_page(request, status=401, error="Your tenant is unknown or disabled.")
    return await start_session(request, tenant_id=claims.tenant_id, user_id=claims.sub, roles=list(claims.roles),
                               via="oidc")


@get("/", include_in_schema=False)
async def console_home(request: Request) -> Response[Any]:
    try:
        await signed_in(request)
    except SignInRequired:
        return redirect(SIGN_IN)
    return redirect(f"{PREFIX}/approvals")


@get("/sign-in", include_in_schema=False)
async def sign_in_form(request: Request) -> Response[str]:
    return sign_in_page(request)


@post("/sign-in", include_in_schema=False, status_code=303)
async def sign_in_with_token(request: Request) -> Response[Any]:
    services = services_of(request)
    if services.settings.oidc.enabled:  # the provider is then the only way in, not just the one offered
        raise GatewayError(ErrorCode.NOT_FOUND, "Sign in with your identity provider.")
    cookie = request.cookies.get(SIGN_IN_COOKIE)
    fields = await checked_form(request, cookie if well_formed(cookie) else None)
    token = fields.get("token", "").strip()
    if not token:
        return sign_in_page(request, status=400, error="Paste your token to sign in.")
    try:
        claims = await services.token_verifier.verify(token)
    except InvalidToken as exc:
        log.info("console_sign_in_refused", reason=exc.reason)
        return sign_in_page(request, status=401, error="This token was not accepted (expired, badly signed or "
                            "not for this gateway).")
    directory = services.tenant_directory
    principal = await directory.principal(claims.tenant_id, claims.sub, claims.roles)
    if principal is None or directory.is_disabled(principal.tenant_id):
        log.info("console_sign_in_refused", reason="unknown_or_disabled_tenant")
        return sign_in_page(request, status=401, error="This token's tenant is unknown or disabled.")
    return await start_session(request, tenant_id=claims.tenant_id, user_id=claims.sub, roles=list(claims.roles))


@post("/sign-out", include_in_schema=False, status_code=303)
async def sign_out(request: Request) -> Response[Any]:
    """Ends the session the cookie names, whatever became of its user or tenant since: a user
    of a tenant disabled meanwhile still ends theirs, or the old cookie would work again once
    the tenant is enabled. Spends no rate tokens: a user over the rate can still sign out."""
    services = services_of(request)
    store = session_store(services)
    value = request.cookies.get(COOKIE)
    record = await store.use(value)
    if record is None:
        raise SignInRequired()
    await checked_form(request, record.csrf_token)
    await store.end(value)
    log.info("console_signed_out", tenant=record.tenant_id, user=record.user_id)
    return redirect(SIGN_IN, cookies=[cleared_cookie(request, services)])
