"""The caller's tools, in the OpenAI ``tools`` format."""

from __future__ import annotations

from litestar import Controller, MediaType, Response, get
from litestar.di import Provide

from gateway.api.dependencies import provide_registry
from gateway.api.openapi import error_responses
from gateway.api.schemas import ToolList
from gateway.auth.principal import Principal
from gateway.tools.registry import ToolRegistry


class ToolController(Controller):
    path = "/v1/tools"
    tags = ["tools"]
    dependencies = {"registry": Provide(provide_registry, sync_to_thread=False)}

    @get("/", summary="List the caller's tools", responses=error_responses(401, 503))
    async def list_tools(self, principal: Principal, registry: ToolRegistry) -> Response[ToolList]:
        """Only the tools the caller's roles grant, sorted by name; identical bytes between calls."""
        return Response(content=registry.definitions_json(principal.permissions), media_type=MediaType.JSON)
