"""The approver's console at ``/console/``: server-rendered pages over the same services as
the API, signed in with a cookie session instead of a bearer token (``gateway.console.web``)."""

from __future__ import annotations

from litestar import Router
from litestar.static_files import create_static_files_router

from gateway.console import approvals, audit, signin, tenant
from gateway.console.links import console_url
from gateway.console.web import EXCEPTION_HANDLERS, PREFIX, STATIC

__all__ = ["CONSOLE_PATHS", "console_routers", "console_url"]

CONSOLE_PATHS = r"^/console(/|$)"
"""Anchored: what the bearer-token middleware leaves to the console's own session check."""


def console_routers() -> list[Router]:
    pages = Router(
        path=PREFIX,
        route_handlers=[
            signin.console_home,
            signin.sign_in_form,
            signin.sign_in_with_token,
            signin.sign_out,
            *approvals.HANDLERS,
            *audit.HANDLERS,
            *tenant.HANDLERS,
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        include_in_schema=False,
    )
    static = create_static_files_router(
        path=f"{PREFIX}/static", directories=[STATIC], include_in_schema=False, name="console_static",
        exception_handlers=EXCEPTION_HANDLERS,
    )
    return [pages, static]
