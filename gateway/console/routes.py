"""The console's routes: its pages under ``/console`` and its stylesheet, with the exception
handlers that answer pages (sign-in redirects, 403 and 404 pages) instead of JSON."""

from __future__ import annotations

from litestar import Router
from litestar.static_files import create_static_files_router

from gateway.auth.middleware import CONSOLE_PATHS
from gateway.console import approvals, audit, signin, tenant, webhooks
from gateway.console.web import EXCEPTION_HANDLERS, PREFIX, STATIC

__all__ = ["CONSOLE_PATHS", "console_routers"]



def console_routers() -> list[Router]:
    pages = Router(
        path=PREFIX,
        route_handlers=[
            signin.console_home,
            signin.sign_in_form,
            signin.sign_in_with_token,
            signin.sign_out,
            signin.oidc_start,
            signin.oidc_callback,
            *approvals.HANDLERS,
            *audit.HANDLERS,
            *tenant.HANDLERS,
            *webhooks.HANDLERS,
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        include_in_schema=False,
    )
    static = create_static_files_router(
        path=f"{PREFIX}/static", directories=[STATIC], include_in_schema=False, name="console_static",
        exception_handlers=EXCEPTION_HANDLERS,
    )
    return [pages, static]
