"""The caller's tools, in the OpenAI ``tools`` format."""

from __future__ import annotations

from litestar import Controller, MediaType, Request, Response, get
from litestar.di import NamedDependency

from gateway.api.dependencies import principal_of
from gateway.api.openapi import error_responses
from gateway.api.schemas import ToolList
from gateway.tools.registry import ToolRegistry


class ToolController(Controller):
    path = "/v1/tools"
    tags = ["tools"]

    @get("/", summary="List the caller's tools", responses=error_responses(401, 503))
    async def list_tools(self, request: Request, registry: NamedDependency[ToolRegistry]) -> Response[ToolList]:
        """Only the tools the caller's roles grant and the tenant's policies allow, sorted by name;
        identical bytes between calls."""
        principal = principal_of(request)
        definitions = registry.definitions_json(
            principal.permissions, roles=principal.roles, policies=principal.tool_policies
        )
        return Response(content=definitions, media_type=MediaType.JSON)
