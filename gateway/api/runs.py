"""Runs: a budgeted context for a model's tool calls, owned by one user of one tenant."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Controller, MediaType, Request, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.response.base import ASGIResponse
from litestar.params import JSONBody
from litestar.di import NamedDependency

from gateway.api.context import request_id_of
from gateway.api.dependencies import principal_of
from gateway.api.openapi import error_responses, raw_json_body
from gateway.api.params import ResourceId
from gateway.api.tool_answer import encode_tool_messages
from gateway.api.schemas import (
    HistoryMessage,
    RunCreate,
    RunLimits,
    RunLimitsIn,
    RunUsage,
    RunView,
    ToolCallBatchContract,
    ToolCallsResponse,
)
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.executor import ToolExecutor
from gateway.execution.runs import RequestedLimits, RunService
from gateway.observability.timing import timer_of
from gateway.wiring import services_of


def run_view(row: Any, now: datetime, messages: list[dict[str, Any]] | None = None) -> RunView:
    expired = row.expires_at is not None and row.expires_at <= now
    return RunView(
        id=row.id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        status="expired" if expired else "active",
        limits=RunLimits(
            max_tool_calls=row.max_tool_calls,
            max_repeats=row.max_repeats,
            expires_at=row.expires_at,
            max_steps=row.max_steps,
            max_total_tokens=row.max_total_tokens,
            timeout_s=row.timeout_s,
        ),
        usage=RunUsage(
            tool_calls=row.used_tool_calls,
            model_calls=row.steps,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            total_tokens=row.prompt_tokens + row.completion_tokens,
        ),
        created_at=row.created_at,
        state=row.loop_state,
        stop_reason=row.stop_reason,
        provider=row.provider,
        model=row.model,
        messages_dropped=row.messages_dropped,
        messages=msgspec.convert(messages or [], list[HistoryMessage]),
    )


class RunController(Controller):
    path = "/v1/runs"
    tags = ["runs"]

    @post("/", status_code=201, summary="Create a run", responses=error_responses(400, 401, 403, 413, 503))
    async def create_run(
        self, request: Request, runs: NamedDependency[RunService], data: JSONBody[RunCreate | None] = None
    ) -> RunView:
        """Create a run owned by the caller. Limits default from settings and are clamped by the tenant's caps."""
        requested = data or RunCreate()
        if requested.limits is not None:
            if any(v is not None for v in (requested.max_tool_calls, requested.max_repeats, requested.expires_at)):
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST, "Give the limits at the top level or under `limits`, not both."
                )
            source: RunLimitsIn = requested.limits
        else:
            source = requested
        limits = RequestedLimits(
            max_tool_calls=source.max_tool_calls, max_repeats=source.max_repeats, expires_at=source.expires_at
        )
        row = await runs.create(principal_of(request), limits)
        return run_view(row, datetime.now(UTC))

    @get("/{run_id:str}", summary="Read a run", responses=error_responses(400, 401, 404, 503))
    async def get_run(self, request: Request, runs: NamedDependency[RunService], run_id: ResourceId) -> RunView:
        """A run of another user or tenant is not found. An agent run also shows its loop state, token usage and
        the messages of its history."""
        principal = principal_of(request)
        row = await runs.get(principal, run_id)
        messages = await runs.history(principal, run_id) if row.loop_state is not None else None
        return run_view(row, datetime.now(UTC), messages)

    @post(
        "/{run_id:str}/tool-calls",
        status_code=200,
        summary="Execute a batch of tool calls",
        operation_class=raw_json_body(
            ToolCallBatchContract, "The assistant message's `tool_calls`, exactly as the model produced them."
        ),
        responses={
            200: ResponseSpec(
                data_container=ToolCallsResponse,
                description="One `role=tool` message per call, in the order given.",
                generate_examples=False,
            ),
            **error_responses(400, 401, 404, 413, 422, 503),
        },
    )
    async def execute_tool_calls(self, request: Request, run_id: ResourceId) -> ASGIResponse:
        """Run each call through the guards and answer one `role=tool` message per call, in the order given."""
        body = await request.body()
        executor: ToolExecutor = services_of(request.app).executor
        messages = await executor.execute_body(
            principal_of(request), run_id, body, request_id=request_id_of(request.scope),
            timer=timer_of(request.scope),
        )
        # Encoded here rather than by Litestar's response building, which costs more than the
        # encoding (the document still names ToolCallsResponse, above).
        return ASGIResponse(body=encode_tool_messages(messages), media_type=MediaType.JSON)
