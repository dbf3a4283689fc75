"""The application for an ASGI server's worker processes, built from the environment.

``gateway serve`` runs ``uvicorn gateway.asgi:create_app_from_env --factory``; each worker
process imports this module and builds its own app from the same ``GATEWAY_*`` variables
(demo mode included: ``gateway serve --demo`` puts its secret in the environment first).
Any ASGI server that takes an app factory can run the gateway the same way.
"""

from __future__ import annotations

import importlib.util

from litestar import Litestar

from gateway.app import create_app
from gateway.logging import configure_logging
from gateway.settings import Settings


def create_app_from_env() -> Litestar:
    settings = Settings.from_env()
    configure_logging(settings.log.level, settings.log.format)
    _bound_request_heads(settings)
    if not settings.demo:
        settings.require_signing_setup()
    return create_app(settings)


def _bound_request_heads(settings: Settings) -> None:
    """``gateway serve``'s protocol (``gateway.http_server``, on httptools) takes its limits on
    request heads from this process's settings; another server keeps its own."""
    if importlib.util.find_spec("httptools") is None:
        return
    from gateway import http_server

    http_server.configure(
        max_head_bytes=settings.requests.max_head_bytes,
        head_timeout_s=settings.server.head_timeout_s,
        body_timeout_s=settings.server.body_timeout_s,
    )
