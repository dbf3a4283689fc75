"""What every console page shares: the security headers, the session cookie, who is signed
in (the same ``Principal`` the bearer middleware builds, from the session's identity), the
CSRF check of every form, and the pages that say no (sign in, 403, 404, ...)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from markupsafe import Markup
from litestar import Request, Response
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.datastructures import Cookie
from litestar.enums import MediaType
from litestar.exceptions import HTTPException, NotAuthorizedException, ValidationException
from litestar.response import Redirect

from gateway.api.context import request_id_of
from gateway.api.errors import is_database_unavailable
from gateway.auth.principal import Principal
from gateway.console.sessions import ConsoleSessionRecord, SessionStore
from gateway.errors import ERRORS, ErrorCode, GatewayError, new_error_id
from gateway.logging import bind_request
from gateway.ratelimit.middleware import spend_rate
from gateway.text import is_storable, visible
from gateway.wiring import SLOT_KEY, Services

log = structlog.get_logger("gateway.console")

COOKIE = "gateway_console"
PREFIX = "/console"
SIGN_IN = f"{PREFIX}/sign-in"
TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

MAX_FIELD_CHARS = 16_384
"""The longest value any console form field may hold (a token is far shorter)."""

ENGINE = JinjaTemplateEngine(directory=TEMPLATES)


def _shown(value: Any) -> Any:
    """Every value a page shows, after its bidirectional controls and invisible format
    characters became visible escapes: arguments, results, names and reasons come from
    models, services and requesters, and U+202E would reorder what an approver reads."""
    if not isinstance(value, str):
        return value
    shown = visible(value)
    if shown is value or shown == value:
        return value
    return Markup(shown) if isinstance(value, Markup) else shown


ENGINE.engine.finalize = _shown  # before any template is compiled: finalize is compiled in


class SignInRequired(Exception):
    """No live session: a page redirects to the sign-in page, a form post is refused."""


class FormRefused(Exception):
    """A form without the session's CSRF token, or with a field no form of ours sends."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class SignedIn:
    principal: Principal
    session: ConsoleSessionRecord

    @property
    def csrf_token(self) -> str:
        return self.session.csrf_token


def services_of(request: Request[Any, Any, Any]) -> Services:
    return request.app.state[SLOT_KEY].services  # type: ignore[no-any-return]


def session_store(services: Services) -> SessionStore:
    return SessionStore(services.db, services.settings.console)


def secure_cookie(request: Request[Any, Any, Any], services: Services) -> bool:
    mode = services.settings.console.secure_cookie
    return mode == "always" or (mode == "auto" and request.url.scheme == "https")


def session_cookie(request: Request[Any, Any, Any], services: Services, value: str, *, max_age: int) -> Cookie:
    return Cookie(
        key=COOKIE, value=value, path=PREFIX, httponly=True, samesite="strict",
        secure=secure_cookie(request, services), max_age=max_age,
    )


def cleared_cookie(request: Request[Any, Any, Any], services: Services) -> Cookie:
    return session_cookie(request, services, "", max_age=0)


async def signed_in(request: Request[Any, Any, Any], *, spend: bool = True) -> SignedIn:
    """The signed-in user of this request, or ``SignInRequired``. The identity is rebuilt by
    the tenant directory on every request, as for a bearer token: a role's permissions
    changed, or the tenant disabled, take effect at once."""
    services = services_of(request)
    record = await session_store(services).use(request.cookies.get(COOKIE))
    if record is None:
        raise SignInRequired()
    directory = services.tenant_directory
    principal = await directory.principal(record.tenant_id, record.user_id, record.roles)
    if principal is None or directory.is_disabled(principal.tenant_id):
        raise SignInRequired()
    first = type(request.scope.get("user")) is not Principal
    request.scope["user"] = principal
    bind_request(tenant=principal.tenant_id, user=principal.user_id)
    if first and spend and services.rate_limiter is not None:
        # The console's requests spend the same tenant's and user's tokens as the API's (the
        # API's middleware sees no principal here: the console signs in by cookie).
        await spend_rate(services.rate_limiter, principal)
    return SignedIn(principal=principal, session=record)


async def checked_form(request: Request[Any, Any, Any], csrf_token: str | None) -> dict[str, str]:
    """The posted form's fields, after its CSRF token matched ``csrf_token`` (the session's,
    or the sign-in page's own). One value per field, each storable text of bounded size."""
    form = await request.form()
    fields: dict[str, str] = {}
    for name, value in form.multi_items():
        if not isinstance(value, str) or name in fields:
            raise FormRefused("The form is not one this console sent.")
        if len(value) > MAX_FIELD_CHARS or not is_storable(value) or not is_storable(name):
            raise FormRefused("A field of the form is too long or holds characters that cannot be stored.")
        fields[name] = value
    sent = fields.pop("csrf_token", "")
    if not csrf_token or not hmac.compare_digest(sent.encode(), csrf_token.encode()):
        log.info("console_csrf_refused", path=request.url.path)
        raise FormRefused("The form has expired or did not come from this console. Reload the page and try again.")
    return fields


def render(name: str, **context: Any) -> str:
    return ENGINE.get_template(name).render(**context)


def page(
    name: str, *, status: int = 200, me: SignedIn | None = None, pending: int | None = None,
    cookies: list[Cookie] | None = None, **context: Any,
) -> Response[str]:
    html = render(name, me=me, principal=me.principal if me else None, csrf_token=me.csrf_token if me else None,
                  pending_count=pending, **context)
    return Response(html, status_code=status, media_type=MediaType.HTML, headers=SECURITY_HEADERS, cookies=cookies)


def redirect(path: str, *, cookies: list[Cookie] | None = None) -> Response[Any]:
    return Redirect(path, status_code=303, headers=SECURITY_HEADERS, cookies=cookies)


def problem_page(status: int, title: str, message: str, *, error_id: str | None = None,
                 request_id: str | None = None, headers: dict[str, str] | None = None) -> Response[str]:
    try:
        html = render("problem.html", me=None, principal=None, csrf_token=None, pending_count=None, status=status,
                      title=title, message=message, error_id=error_id, request_id=request_id)
    except Exception:  # noqa: BLE001 - the page that says something failed must not fail
        html = f"<!doctype html><title>{status}</title><p>{status}</p>"
    return Response(html, status_code=status, media_type=MediaType.HTML, headers={**(headers or {}), **SECURITY_HEADERS})


TITLES = {400: "Invalid request", 403: "Not allowed", 404: "Not found", 409: "Already decided",
          413: "Too large", 429: "Too many requests", 503: "Unavailable"}


def on_sign_in_required(request: Request[Any, Any, Any], _: SignInRequired) -> Response[Any]:
    if request.method in ("GET", "HEAD"):
        return redirect(SIGN_IN)
    return problem_page(403, "Signed out", "Your session has ended. Sign in again.",
                        request_id=request_id_of(request.scope))


def on_form_refused(request: Request[Any, Any, Any], exc: FormRefused) -> Response[str]:
    return problem_page(403, "Form refused", exc.message, request_id=request_id_of(request.scope))


def on_gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[str]:
    return problem_page(exc.status, TITLES.get(exc.status, exc.code.value), exc.message,
                        request_id=request_id_of(request.scope), headers=exc.headers)


def on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[str]:
    if isinstance(exc, ValidationException):
        return problem_page(400, "Invalid request", ERRORS[ErrorCode.INVALID_REQUEST].message,
                            request_id=request_id_of(request.scope))
    if isinstance(exc, NotAuthorizedException):
        return on_sign_in_required(request, SignInRequired())
    if exc.status_code >= 500:
        return on_unexpected(request, exc)
    status = exc.status_code
    return problem_page(status, TITLES.get(status, "Refused"), TITLES.get(status, "The request was refused."),
                        request_id=request_id_of(request.scope))


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    error_id = new_error_id()
    try:
        if is_database_unavailable(exc):
            log.warning("database_unavailable", error_id=error_id, error_type=type(exc).__name__)
            return problem_page(503, "Unavailable", ERRORS[ErrorCode.SERVICE_UNAVAILABLE].message, error_id=error_id,
                                request_id=request_id_of(request.scope))
    except Exception:  # noqa: BLE001, S110 - looking at the exception failed: it is an internal error
        pass
    try:
        log.error("console_unexpected_error", error_id=error_id, path=request.scope.get("path"), exc_info=exc)
    except Exception:  # noqa: BLE001, S110 - logging failed; the page still answers
        pass
    return problem_page(500, "Something went wrong", ERRORS[ErrorCode.INTERNAL_ERROR].message, error_id=error_id,
                        request_id=request_id_of(request.scope))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    SignInRequired: on_sign_in_required,
    FormRefused: on_form_refused,
    GatewayError: on_gateway_error,
    # Named as well as its base: Litestar picks the handler of the most specific class across
    # layers, so the API's ValidationException handler (JSON) would otherwise answer a form.
    ValidationException: on_http_exception,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
