"""Runs: a budgeted context for a model's tool calls, owned by one user of one tenant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from litestar import Controller, Request, get, post
from litestar.di import Provide

from gateway.api.context import request_id_of
from gateway.api.dependencies import provide_db, provide_directory, provide_executor, provide_settings
from gateway.api.openapi import error_responses, raw_json_body
from gateway.api.schemas import RunCreate, RunLimits, RunUsage, RunView, ToolCallsResponse, ToolMessageOut
from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.db import runs as run_queries
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.executor import ToolExecutor
from gateway.execution.protocol import ToolCallBatch
from gateway.settings import Settings


def run_view(row: Any, now: datetime) -> RunView:
    expired = row.expires_at is not None and row.expires_at <= now
    return RunView(
        id=row.id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        status="expired" if expired else "active",
        limits=RunLimits(max_tool_calls=row.max_tool_calls, max_repeats=row.max_repeats, expires_at=row.expires_at),
        usage=RunUsage(tool_calls=row.used_tool_calls),
        created_at=row.created_at,
    )


class RunController(Controller):
    path = "/v1/runs"
    tags = ["runs"]
    dependencies = {
        "db": Provide(provide_db, sync_to_thread=False),
        "settings": Provide(provide_settings, sync_to_thread=False),
        "directory": Provide(provide_directory, sync_to_thread=False),
        "executor": Provide(provide_executor, sync_to_thread=False),
    }

    @post(
        "/",
        status_code=201,
        summary="Create a run",
        responses=error_responses(400, 401, 403, 503),
    )
    async def create_run(
        self,
        principal: Principal,
        db: Database,
        settings: Settings,
        directory: TenantDirectory,
        data: RunCreate | None = None,
    ) -> RunView:
        """Create a run owned by the caller. Limits default from settings and are clamped by the tenant's caps."""
        requested = data or RunCreate()
        if requested.limits is not None:
            if any(v is not None for v in (requested.max_tool_calls, requested.max_repeats, requested.expires_at)):
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST, "Give the limits at the top level or under `limits`, not both."
                )
            requested_limits = requested.limits
        else:
            requested_limits = requested
        tenant = await directory.get(principal.tenant_id)
        if tenant is None:
            raise GatewayError(ErrorCode.UNAUTHENTICATED)
        now = datetime.now(UTC)
        max_tool_calls = min(requested_limits.max_tool_calls or settings.run_max_tool_calls,
                             tenant.max_tool_calls_per_run)
        max_repeats = min(requested_limits.max_repeats or settings.run_max_repeats, tenant.max_repeats_per_call)
        latest = now + timedelta(seconds=tenant.max_run_ttl_s)
        expires_at = requested_limits.expires_at
        if expires_at is not None:
            if expires_at.tzinfo is None:
                raise GatewayError(ErrorCode.INVALID_REQUEST, "expires_at must carry a time zone (e.g. Z).")
            if expires_at <= now:
                raise GatewayError(ErrorCode.INVALID_REQUEST, "expires_at must be in the future.")
            expires_at = min(expires_at.astimezone(UTC), latest)
        else:
            expires_at = min(now + timedelta(seconds=settings.run_ttl_s), latest)
        async with db.begin() as conn:
            row = await run_queries.create_run(
                conn,
                tenant_id=principal.tenant_id,
                user_id=principal.user_id,
                max_tool_calls=max_tool_calls,
                max_repeats=max_repeats,
                expires_at=expires_at,
                now=now,
            )
        return run_view(row, now)

    @get("/{run_id:str}", summary="Read a run", responses=error_responses(401, 404, 503))
    async def get_run(self, principal: Principal, db: Database, run_id: str) -> RunView:
        """A run of another user or tenant is not found."""
        async with db.connect() as conn:
            row = await run_queries.get_run(conn, tenant_id=principal.tenant_id, user_id=principal.user_id,
                                            run_id=run_id)
        if row is None:
            raise GatewayError(ErrorCode.NOT_FOUND, "No such run.")
        return run_view(row, datetime.now(UTC))

    @post(
        "/{run_id:str}/tool-calls",
        status_code=200,
        summary="Execute a batch of tool calls",
        operation_class=raw_json_body(
            ToolCallBatch, "The assistant message's `tool_calls`, exactly as the model produced them."
        ),
        responses=error_responses(401, 404, 413, 422, 503),
    )
    async def execute_tool_calls(
        self, request: Request, principal: Principal, executor: ToolExecutor, run_id: str
    ) -> ToolCallsResponse:
        """Run each call through the guards and answer one `role=tool` message per call, in the order given."""
        body = await request.body()
        messages = await executor.execute_body(principal, run_id, body, request_id=request_id_of(request.scope))
        return ToolCallsResponse(
            messages=[
                ToolMessageOut(role="tool", tool_call_id=m.tool_call_id, content=m.content) for m in messages
            ]
        )
