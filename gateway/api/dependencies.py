"""``provide_*`` dependencies: shared resources live on ``app.state``, made in the lifespan.

Handlers take at most one injected dependency and read the caller from ``request.user``:
Litestar resolves two or more dependencies of one level in an anyio task group, which
costs more per request (~150 µs here) than the handlers themselves.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.datastructures import State

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.approvals import ApprovalService
from gateway.execution.runs import RunService
from gateway.tools.registry import ToolRegistry


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    principal = request.scope.get("user")
    if not isinstance(principal, Principal):
        raise GatewayError(ErrorCode.UNAUTHENTICATED)
    return principal


def provide_runs(state: State) -> RunService:
    return state.runs


def provide_approvals(state: State) -> ApprovalService:
    return state.approvals


def provide_registry(state: State) -> ToolRegistry:
    return state.registry
