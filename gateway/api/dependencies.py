"""``provide_*`` dependencies: shared resources live on ``app.state``, made in the lifespan."""

from __future__ import annotations

from litestar import Request
from litestar.datastructures import State

from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.approvals import ApprovalService
from gateway.execution.executor import ToolExecutor
from gateway.settings import Settings
from gateway.tools.registry import ToolRegistry


def provide_principal(request: Request) -> Principal:
    principal = request.scope.get("user")
    if not isinstance(principal, Principal):
        raise GatewayError(ErrorCode.UNAUTHENTICATED)
    return principal


def provide_settings(state: State) -> Settings:
    return state.settings


def provide_db(state: State) -> Database:
    return state.db


def provide_executor(state: State) -> ToolExecutor:
    return state.executor


def provide_approvals(state: State) -> ApprovalService:
    return state.approvals


def provide_registry(state: State) -> ToolRegistry:
    return state.registry


def provide_directory(state: State) -> TenantDirectory:
    return state.tenant_directory
