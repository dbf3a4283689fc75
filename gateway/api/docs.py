"""The documentation page at ``/schema``: Swagger UI, served from the gateway itself.

The page works without internet access: its script, style sheet and icon are the files the
``swagger-ui-py`` package ships (Swagger UI, Apache-2.0, its license served beside them at
``/schema/assets/LICENSE``), read once and served under ``/schema/assets/``. The HTML
references no other origin.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from litestar import Request, Response, Router, get
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.params import FromPath

from gateway.api.openapi import StrictDocument
from gateway.errors import ErrorCode, GatewayError

ASSETS_PATH = "/schema/assets"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
    "LICENSE": "text/plain",
}
"""The files served, by name, with their media type (Litestar adds ``charset=utf-8`` to ``text/`` ones)."""


def assets_dir() -> Path:
    """The package's static folder, found without importing the package (it would import Jinja)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


class DocsRenderPlugin(SwaggerRenderPlugin):
    """Swagger UI over the tightened document, its files served by the gateway."""

    def __init__(self, strict: StrictDocument) -> None:
        super().__init__(
            js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            css_url=f"{ASSETS_PATH}/swagger-ui.css",
            standalone_preset_js_url=f"{ASSETS_PATH}/swagger-ui-standalone-preset.js",
            favicon=f"<link rel='icon' type='image/png' href='{ASSETS_PATH}/favicon-32x32.png'>",
            path="/swagger",
        )
        self.strict = strict
        self._folder = assets_dir()
        self._files: dict[str, bytes] = {}

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.strict(request, openapi_schema))

    def asset(self, name: str) -> Response[bytes]:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise GatewayError(ErrorCode.NOT_FOUND)
        content = self._files.get(name)
        if content is None:
            content = self._files[name] = (self._folder / name).read_bytes()
        return Response(content=content, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})

    def receive_router(self, router: Router) -> None:
        super().receive_router(router)

        @get("/assets/{name:str}", sync_to_thread=False, include_in_schema=False)
        def docs_asset(name: FromPath[str]) -> Response[bytes]:
            return self.asset(name)

        router.register(docs_asset)
