"""Route guards: permissions come from the tenant's role→permission map, never from the request."""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from gateway.auth.middleware import unauthenticated
from gateway.auth.principal import Principal
from gateway.errors import ErrorCode, GatewayError


def requires_permission(permission: str) -> Guard:
    def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        # From the scope: ``connection.user`` raises when authentication never ran.
        principal = connection.scope.get("user")
        if not isinstance(principal, Principal):
            raise unauthenticated()
        if not principal.has(permission):
            raise GatewayError(ErrorCode.FORBIDDEN, f"This action needs the permission {permission!r}.")

    guard.__name__ = f"requires_permission({permission!r})"
    return guard
