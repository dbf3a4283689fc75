"""The application for an ASGI server's worker processes, built from the environment.

``gateway serve`` runs ``uvicorn gateway.asgi:create_app_from_env --factory``; each worker
process imports this module and builds its own app from the same ``GATEWAY_*`` variables
(demo mode included: ``gateway serve --demo`` puts its secret in the environment first).
Any ASGI server that takes an app factory can run the gateway the same way.
"""

from __future__ import annotations

from litestar import Litestar

from gateway.app import create_app
from gateway.logging import configure_logging
from gateway.settings import Settings


def create_app_from_env() -> Litestar:
    settings = Settings.from_env()
    configure_logging(settings.log.level, settings.log.format)
    if not settings.demo:
        settings.require_signing_setup()
    return create_app(settings)
