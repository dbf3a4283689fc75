"""Bearer-token authentication for every ``/v1`` route (Litestar's authentication middleware)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from litestar.connection import ASGIConnection
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.auth.tokens import InvalidToken, TokenVerifier
from gateway.errors import ErrorCode, GatewayError
from gateway.logging import bind_request
from gateway.mcp.server.metadata import MCP_PATH, bearer_challenge
from gateway.observability.timing import AUTH, timer_of

if TYPE_CHECKING:  # the services import the API, which imports PUBLIC_PATHS from here
    from litestar.types import ASGIApp

    from gateway.wiring import ServicesSlot

log = structlog.get_logger("gateway.auth")

# Anchored: Litestar matches these anywhere in the path, so "/healthz" alone would also
# unprotect "/v1/anything/healthz".
CONSOLE_PATHS = r"^/console(/|$)"
"""The console's pages authenticate with its own cookie session (gateway.console.web), not a bearer token."""
PUBLIC_PATHS = [
    r"^/healthz$",
    r"^/readyz$",
    r"^/metrics$",
    r"^/schema(/.*)?$",
    r"^/\.well-known/jwks\.json$",
    r"^/\.well-known/oauth-protected-resource(/mcp)?$",
    CONSOLE_PATHS,
]


def unauthenticated(connection: ASGIConnection | None = None) -> GatewayError:
    """The 401; on the MCP endpoint its challenge names the resource metadata (RFC 9728), where
    an MCP client learns which authorization server issues the tokens."""
    if connection is not None and connection.scope["path"] == MCP_PATH:
        challenge = bearer_challenge(str(connection.base_url))
    else:
        challenge = 'Bearer realm="gateway"'
    return GatewayError(ErrorCode.UNAUTHENTICATED, headers={"WWW-Authenticate": challenge})


def _authorization_header(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"authorization":
            return value.decode("latin-1")
    return ""


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The request's bearer token, stripped; None when it has none."""
    scheme, _, token = _authorization_header(headers).partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def cached_caller(token: str, verifier: TokenVerifier, directory: TenantDirectory) -> Principal | None:
    """The caller of a token verified recently, of a tenant whose entry is fresh and enabled,
    without awaiting anything; None when any of it needs the full check (or a refusal)."""
    claims = verifier.cached(token)
    if claims is None:
        return None
    principal = directory.cached_principal(claims.tenant_id, claims.sub, claims.roles)
    if principal is None or directory.is_disabled(principal.tenant_id):
        return None
    return principal


class JWTAuthenticationMiddleware(AbstractAuthenticationMiddleware):
    """Verifies the bearer token and finds its tenant with the app's services (``services``);
    Litestar's own options (``exclude``, ``exclude_http_methods``) pass through."""

    def __init__(self, app: ASGIApp, *, services: ServicesSlot, **options: Any) -> None:
        super().__init__(app, **options)
        self._services = services

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        timer = timer_of(connection.scope)
        timer.begin()
        try:
            return await self._authenticate(connection)
        finally:
            timer.lap(AUTH)  # refusals too: their responses carry Server-Timing as well

    async def _authenticate(self, connection: ASGIConnection) -> AuthenticationResult:
        # Read from the raw header list: building the request's header mapping costs more than
        # everything else a cached token needs here.
        token = bearer_token(connection.scope["headers"])
        if token is None:
            log.info("authentication_failed", reason="missing_bearer")
            raise unauthenticated(connection)
        services = self._services.services
        verifier: TokenVerifier = services.token_verifier
        directory: TenantDirectory = services.tenant_directory
        principal = cached_caller(token, verifier, directory)
        if principal is None:
            principal = await self._checked_caller(connection, token, verifier, directory)
        bind_request(tenant=principal.tenant_id, user=principal.user_id)
        return AuthenticationResult(user=principal, auth=None)

    @staticmethod
    async def _checked_caller(
        connection: ASGIConnection, token: str, verifier: TokenVerifier, directory: TenantDirectory
    ) -> Principal:
        """The full check, when anything about the token or its tenant is not cached (or refused)."""
        claims = verifier.cached(token)
        if claims is None:
            try:
                claims = await verifier.verify(token)
            except InvalidToken as exc:
                log.info("authentication_failed", reason=exc.reason)
                raise unauthenticated(connection) from None
        principal = directory.cached_principal(claims.tenant_id, claims.sub, claims.roles)
        if principal is None:
            principal = await directory.principal(claims.tenant_id, claims.sub, claims.roles)
        if principal is None:
            log.info("authentication_failed", reason="unknown_tenant")
            raise unauthenticated(connection)
        if directory.is_disabled(principal.tenant_id):
            log.info("tenant_disabled", tenant=principal.tenant_id)
            raise GatewayError(ErrorCode.TENANT_DISABLED)
        return principal
