"""Approvals: the requester reads theirs; administrators list and decide them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import CacheControlHeader
from litestar.di import NamedDependency
from litestar.params import FromQuery, JSONBody, QueryParameter

from gateway.api.context import request_id_of
from gateway.api.dependencies import principal_of
from gateway.api.openapi import error_responses
from gateway.api.params import RESOURCE_ID_PATTERN, ResourceId, decode_cursor, encode_cursor
from gateway.api.schemas import ApprovalOutcome, ApprovalPage, ApprovalView, ErrorInfo, RejectBody
from gateway.auth.guards import requires_permission
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.approvals import ApprovalService, effective_status
from gateway.execution.results import read_content
from gateway.execution.runner import OK

APPROVAL_STATUSES = ("pending", "executing", "succeeded", "failed", "rejected", "expired")


def outcome_view(code: str | None, content: str | None) -> ApprovalOutcome | None:
    if code is None or content is None:
        return None
    try:
        stored = read_content(content)
    except msgspec.DecodeError:
        # Not content as this version writes it (an older version stored a service's JSON
        # that no reader here can hold, such as 1e400): shown as the text it is.
        return ApprovalOutcome(code=code, ok=code == OK, result=content)
    if stored.ok:
        return ApprovalOutcome(
            code=code, ok=True, result=stored.result, truncated=stored.truncated, original_bytes=stored.original_bytes
        )
    error = stored.error
    if error is None:
        return ApprovalOutcome(code=code, ok=False, result=content)
    return ApprovalOutcome(
        code=code,
        ok=False,
        error=ErrorInfo(code=error.code, message=error.message, retryable=error.retryable,
                        approval_id=error.approval_id, error_id=error.error_id),
    )


def approval_view(row: Any, service: ApprovalService, now: datetime, *, reveal: bool = False) -> ApprovalView:
    hidden = [] if reveal else service.hidden_fields(row)
    return ApprovalView(
        id=row.id,
        status=effective_status(row, now),
        tool=row.tool,
        arguments=service.view_arguments(row, reveal=reveal),
        arguments_sha256=None if hidden else row.arguments_sha256,
        run_id=row.run_id,
        tool_call_id=row.tool_call_id,
        requested_by=row.requester_id,
        requested_at=row.created_at,
        expires_at=row.expires_at,
        decided_by=row.decided_by,
        decided_at=row.decided_at,
        reason=row.reason,
        outcome=outcome_view(row.outcome, service.view_outcome_content(row, reveal=reveal)),
        redacted_fields=hidden,
    )


ApprovalCursor = tuple[
    Annotated[datetime, msgspec.Meta(tz=True)], Annotated[str, msgspec.Meta(pattern=RESOURCE_ID_PATTERN)]
]
"""(created_at, id) of the last approval of a page."""


def approvals_cursor(row: Any) -> str:
    return encode_cursor([row.created_at.isoformat(), row.id])


def approvals_after(cursor: str) -> tuple[datetime, str]:
    created_at, approval_id = decode_cursor(cursor, ApprovalCursor)  # type: ignore[arg-type]
    return created_at.astimezone(UTC), approval_id


class ApprovalController(Controller):
    path = "/v1/approvals"
    tags = ["approvals"]

    @get("/{approval_id:str}", summary="Read an approval you requested", responses=error_responses(400, 401, 404, 503))
    async def get_approval(self, request: Request, approvals: NamedDependency[ApprovalService], approval_id: ResourceId) -> ApprovalView:
        """The requester (or an approver) reads the approval's status and, once executed, its outcome."""
        row = await approvals.get_for_requester(principal_of(request), approval_id)
        return approval_view(row, approvals, datetime.now(UTC))


class AdminApprovalController(Controller):
    path = "/v1/admin/approvals"
    tags = ["admin"]
    guards = [requires_permission("approvals:decide")]

    @get("/", summary="List the tenant's approvals", responses=error_responses(400, 401, 403, 503))
    async def list_approvals(
        self,
        request: Request,
        approvals: NamedDependency[ApprovalService],
        status: Annotated[
            str | None,
            QueryParameter(
                description=f"One of {', '.join(APPROVAL_STATUSES)}",
                schema_extra={"enum": [*APPROVAL_STATUSES, None]},
            ),
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 50,
        cursor: FromQuery[str | None] = None,
    ) -> ApprovalPage:
        """Newest first; pass `next_cursor` back as `cursor` for the next page."""
        if status is not None and status not in APPROVAL_STATUSES:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"status must be one of {', '.join(APPROVAL_STATUSES)}.")
        after = approvals_after(cursor) if cursor else None
        rows = await approvals.list(principal_of(request), status=status, limit=limit + 1, after=after)
        now = datetime.now(UTC)
        page = rows[:limit]
        return ApprovalPage(
            items=[approval_view(row, approvals, now) for row in page],
            next_cursor=approvals_cursor(page[-1]) if len(rows) > limit else None,
        )

    @get(
        "/{approval_id:str}",
        summary="Read an approval, its sensitive arguments on request",
        responses=error_responses(400, 401, 403, 404, 503),
        cache_control=CacheControlHeader(no_store=True),
    )
    async def get_approval(
        self,
        request: Request,
        approvals: NamedDependency[ApprovalService],
        approval_id: ResourceId,
        reveal: Annotated[
            bool, QueryParameter(description="Show the sensitive arguments too; who revealed them is audited.")
        ] = False,
    ) -> ApprovalView:
        """The frozen call exactly as approving would execute it. Its tool's sensitive fields are
        `[REDACTED]` (named in `redacted_fields`) unless `reveal=true`, which is recorded in the
        audit (`approval_reveal`: who, which approval, which fields) before the answer is sent."""
        row = await approvals.get_for_approver(
            principal_of(request), approval_id, reveal=reveal, request_id=request_id_of(request.scope)
        )
        return approval_view(row, approvals, datetime.now(UTC), reveal=reveal)

    @post(
        "/{approval_id:str}/approve",
        status_code=200,
        summary="Approve and execute the call",
        responses=error_responses(400, 401, 403, 404, 409, 503),
    )
    async def approve(
        self, request: Request, approvals: NamedDependency[ApprovalService], approval_id: ResourceId
    ) -> ApprovalView:
        """Executes the frozen call exactly once, as its requester; answers the approval with its outcome."""
        row = await approvals.approve(principal_of(request), approval_id, request_id=request_id_of(request.scope))
        return approval_view(row, approvals, datetime.now(UTC))

    @post(
        "/{approval_id:str}/reject",
        status_code=200,
        summary="Reject the call",
        responses=error_responses(400, 401, 403, 404, 409, 413, 503),
    )
    async def reject(
        self, request: Request, approvals: NamedDependency[ApprovalService], approval_id: ResourceId, data: JSONBody[RejectBody]
    ) -> ApprovalView:
        """The call's outcome becomes `APPROVAL_REJECTED`, with the reason."""
        row = await approvals.reject(principal_of(request), approval_id, data.reason, request_id=request_id_of(request.scope))
        return approval_view(row, approvals, datetime.now(UTC))
