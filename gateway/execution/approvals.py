"""Approvals: an administrator's decision on one frozen call, executed at most once.

What is approved is the call as it was requested: tool, canonical arguments (stored as
the text that was hashed, checked against that sha256, and decoded from exactly that text
to execute), requester and roles, run and ``tool_call_id``. Approving first claims the
approval (``pending → executing``) in its own committed transaction, so concurrent
approvers, processes or retries cannot run it twice; the call then runs with the
requester's identity, under the tenant's current tool policy, and its writes, its outcome
and its audit row commit together (``transactional.TransactionalCalls``).

An approval whose run expired cannot be decided: the attempt expires it with the outcome
``RUN_EXPIRED`` (stored as the call's outcome, audited) and nothing runs. An approver sees
the frozen arguments with the tool's sensitive fields hidden, and whole only on explicit
request, which is audited (``approval_reveal``) before anything is shown.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from gateway.audit.rows import AuditRow, append_audit
from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.db import approvals as q
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.db.policies import NO_POLICIES
from gateway.execution.guards.permission import allows
from gateway.execution.policy import ToolLimits, tool_limits
from gateway.execution.results import error_content
from gateway.errors import new_error_id
from gateway.execution.runner import CallOutcome
from gateway.execution.transactional import TransactionalCalls, failure
from gateway.observability.metrics import Metrics
from gateway.settings import Settings
from gateway.tools.base import REDACTED, ArgumentsInvalid, DecodedArguments, Tool, sha256_hex
from gateway.tools.registry import ToolRegistry
from gateway.tools.scrub import Sensitive

log = structlog.get_logger("gateway.approvals")


def idempotency_key_for(tenant_id: str, approval_id: str) -> str:
    """Sent to services that honour one, so a retried execution cannot apply twice. An
    approval id is unique within its tenant only (migration 0020): the tenant is part of it."""
    return hashlib.sha256(f"gateway-approval:{tenant_id}:{approval_id}".encode()).hexdigest()


_EXPIRY_CONTENTS = {code.value: error_content(code) for code in (ErrorCode.RUN_EXPIRED, ErrorCode.APPROVAL_EXPIRED)}
"""What the held-back call answers once its approval expired, by outcome."""


def effective_status(row: Any, now: datetime) -> str:
    """A pending approval that can no longer be decided (it or its run expired) reads as expired."""
    run_expired = row.run_expires_at is not None and row.run_expires_at <= now
    if row.status == "pending" and (row.expires_at <= now or run_expired):
        return "expired"
    return str(row.status)


class ApprovalService:
    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        registry: ToolRegistry,
        directory: TenantDirectory,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._db = db
        self._registry = registry
        self._directory = directory
        self._calls = TransactionalCalls(settings=settings, db=db)

    async def get(self, principal: Principal, approval_id: str) -> Any:
        async with self._db.connect() as conn:
            row = await q.get_approval(conn, tenant_id=principal.tenant_id, approval_id=approval_id)
        if row is None:
            raise GatewayError(ErrorCode.NOT_FOUND, "No such approval.")
        return row

    async def get_for_requester(self, principal: Principal, approval_id: str) -> Any:
        row = await self.get(principal, approval_id)
        if row.requester_id != principal.user_id and not principal.has("approvals:decide"):
            raise GatewayError(ErrorCode.NOT_FOUND, "No such approval.")
        return row

    async def get_for_approver(
        self, approver: Principal, approval_id: str, *, reveal: bool, request_id: str | None
    ) -> Any:
        """An approval as an approver reads it; ``reveal``: its sensitive arguments will be shown
        whole, so who saw them is audited first, in the same transaction as the read."""
        if not reveal:
            return await self.get(approver, approval_id)
        async with self._db.begin() as conn:
            row = await q.get_approval(conn, tenant_id=approver.tenant_id, approval_id=approval_id)
            if row is None:
                raise GatewayError(ErrorCode.NOT_FOUND, "No such approval.")
            await self._audit(
                conn, row, kind="approval_reveal", user_id=approver.user_id, outcome="REVEALED",
                request_id=request_id, now=_now(),
                detail={"requester": row.requester_id, "fields": self.hidden_fields(row)},
            )
        log.info("approval_arguments_revealed", approval_id=approval_id, tool=row.tool)
        return row

    async def list(
        self, principal: Principal, *, status: str | None, limit: int, after: tuple[datetime, str] | None
    ) -> list[Any]:
        async with self._db.connect() as conn:
            return await q.list_approvals(
                conn, tenant_id=principal.tenant_id, status=status, now=_now(), limit=limit, after=after
            )

    async def approve(self, approver: Principal, approval_id: str, *, request_id: str | None) -> Any:
        now = _now()
        async with self._db.begin() as conn:
            row = await q.get_approval(conn, tenant_id=approver.tenant_id, approval_id=approval_id)
            if row is None:
                raise GatewayError(ErrorCode.NOT_FOUND, "No such approval.")
            refusal: ErrorCode | None = None
            if row.requester_id == approver.user_id and not self._settings.approvals.allow_self_approval:
                refusal = ErrorCode.SELF_APPROVAL_FORBIDDEN
            elif not await q.claim_for_execution(
                conn, tenant_id=approver.tenant_id, approval_id=approval_id, approver_id=approver.user_id, now=now
            ):
                refusal = await self._why_not_pending(conn, row, now)
            await self._audit_decision(conn, approver, row, outcome=(refusal or "APPROVED"), request_id=request_id,
                                       now=now)
        if refusal is not None:
            log.info("approval_refused", approval_id=approval_id, outcome=refusal.value)
            raise GatewayError(refusal)
        self._metrics.approval_decided("approved")
        log.info("approval_approved", approval_id=approval_id, requester=row.requester_id)
        await self._execute(row, approver, request_id=request_id)
        return await self.get(approver, approval_id)

    async def reject(self, approver: Principal, approval_id: str, reason: str, *, request_id: str | None) -> Any:
        now = _now()
        content = error_content(ErrorCode.APPROVAL_REJECTED, f"An administrator rejected this action: {reason}")
        async with self._db.begin() as conn:
            row = await q.get_approval(conn, tenant_id=approver.tenant_id, approval_id=approval_id)
            if row is None:
                raise GatewayError(ErrorCode.NOT_FOUND, "No such approval.")
            refusal: ErrorCode | None = None
            if await q.reject(
                conn,
                tenant_id=approver.tenant_id,
                approval_id=approval_id,
                approver_id=approver.user_id,
                reason=reason,
                outcome=ErrorCode.APPROVAL_REJECTED.value,
                content=content,
                now=now,
            ):
                await q.store_call_outcome(
                    conn, tenant_id=row.tenant_id, run_id=row.run_id, tool_call_id=row.tool_call_id,
                    outcome=ErrorCode.APPROVAL_REJECTED.value, content=content, now=now,
                )
            else:
                refusal = await self._why_not_pending(conn, row, now)
            await self._audit_decision(conn, approver, row, outcome=(refusal or "REJECTED"), request_id=request_id,
                                       now=now, reason=reason)
        if refusal is not None:
            raise GatewayError(refusal)
        self._metrics.approval_decided("rejected")
        log.info("approval_rejected", approval_id=approval_id)
        return await self.get(approver, approval_id)

    async def _why_not_pending(self, conn: Any, row: Any, now: datetime) -> ErrorCode:
        """Why a decision did not take: the approval (or its run) expired — then it is expired
        now, with that outcome stored for the held-back call — or it was already decided."""
        expired = await q.expire_if_due(
            conn, tenant_id=row.tenant_id, approval_id=row.id, now=now, contents=_EXPIRY_CONTENTS
        )
        if expired is not None:
            await q.store_call_outcome(
                conn, tenant_id=row.tenant_id, run_id=row.run_id, tool_call_id=row.tool_call_id,
                outcome=expired, content=_EXPIRY_CONTENTS[expired], now=now,
            )
            self._metrics.approval_decided("expired")
            return ErrorCode(expired)
        current = await q.get_approval(conn, tenant_id=row.tenant_id, approval_id=row.id)
        if current is not None and current.status == "expired":
            return ErrorCode(current.outcome or ErrorCode.APPROVAL_EXPIRED.value)
        return ErrorCode.ALREADY_DECIDED

    async def _execute(self, row: Any, approver: Principal, *, request_id: str | None) -> None:
        """Run the frozen call as its requester; record outcome and audit with the call's own writes."""
        requester = await self._requester(row)

        async def record(conn: Any, outcome: CallOutcome) -> None:
            await self._store_outcome(conn, row, approver, outcome, request_id=request_id)

        refused, tool, decoded, limits = self._prepare(row, requester)
        if refused is not None:
            outcome = await self._calls.record_only(refused, record)
        else:
            assert tool is not None and decoded is not None and limits is not None
            outcome = await self._calls.run(
                tool,
                decoded,
                limits=limits,
                principal=requester,
                run_id=row.run_id,
                tool_call_id=row.tool_call_id,
                request_id=request_id,
                record=record,
                idempotency_key=idempotency_key_for(row.tenant_id, row.id),
                log_fields={"approval_id": row.id},
            )
        log.info(
            "approval_executed", approval_id=row.id, tool=row.tool, outcome=outcome.outcome, run=row.run_id,
            tool_call_id=row.tool_call_id, requester=row.requester_id, duration_ms=outcome.duration_ms,
        )

    def _prepare(
        self, row: Any, requester: Principal
    ) -> tuple[CallOutcome | None, Tool | None, DecodedArguments | None, ToolLimits | None]:
        """The frozen call as it runs now: refused when the tool is gone, the arguments were
        changed, or the requester (or the tenant's policy) no longer allows it; else with the
        limits the tenant's current policy gives it."""
        tool = self._registry.get(row.tool)
        canonical = row.canonical_arguments.encode()
        if tool is None:
            return failure(ErrorCode.TOOL_NOT_FOUND, "This tool no longer exists."), None, None, None
        if sha256_hex(canonical) != row.arguments_sha256:
            return _unexpected("approval_arguments_tampered", approval_id=row.id), None, None, None
        if not allows(requester, tool):
            return (failure(ErrorCode.PERMISSION_DENIED, "The requester may no longer use this tool."),
                    None, None, None)
        try:
            decoded = tool.arguments.decode(canonical)
        except ArgumentsInvalid as exc:
            return failure(ErrorCode.INVALID_ARGUMENTS, exc.message), None, None, None
        return None, tool, decoded, tool_limits(tool, requester.tool_policies.for_tool(tool.name))

    async def _store_outcome(
        self, conn: Any, row: Any, approver: Principal, outcome: CallOutcome, *, request_id: str | None
    ) -> None:
        now = _now()
        await q.finish(
            conn, tenant_id=row.tenant_id, approval_id=row.id, succeeded=outcome.ok,
            outcome=outcome.outcome, content=outcome.content, now=now,
        )
        await q.store_call_outcome(
            conn, tenant_id=row.tenant_id, run_id=row.run_id, tool_call_id=row.tool_call_id, outcome=outcome.outcome,
            content=outcome.content, now=now,
        )
        await self._audit(
            conn,
            row,
            kind="tool_call",
            user_id=row.requester_id,
            outcome=outcome.outcome,
            request_id=request_id,
            now=now,
            duration_ms=outcome.duration_ms,
            error_id=outcome.error_id,
            detail={"approved_by": approver.user_id},
        )

    async def _audit_decision(
        self, conn: Any, approver: Principal, row: Any, *, outcome: str, request_id: str | None, now: datetime,
        reason: str | None = None,
    ) -> None:
        detail: dict[str, Any] = {"requester": row.requester_id}
        if reason is not None:
            detail["reason"] = reason
        await self._audit(
            conn,
            row,
            kind="approval_decision",
            user_id=approver.user_id,
            outcome=str(outcome),
            request_id=request_id,
            now=now,
            detail=detail,
        )

    async def _audit(
        self, conn: Any, row: Any, *, kind: str, user_id: str, outcome: str, request_id: str | None, now: datetime,
        **fields: Any,
    ) -> None:
        """An audit row about the approval's frozen call, its arguments redacted as its tool says."""
        await append_audit(
            conn,
            AuditRow(
                tenant_id=row.tenant_id,
                kind=kind,
                outcome=outcome,
                created_at=now,
                user_id=user_id,
                run_id=row.run_id,
                tool_call_id=row.tool_call_id,
                tool=row.tool,
                arguments=self._redacted(row),
                arguments_sha256=row.arguments_sha256,
                approval_id=row.id,
                request_id=request_id,
                **fields,
            ),
        )

    def view_arguments(self, row: Any, *, reveal: bool) -> dict[str, Any]:
        """The frozen arguments as they will execute (decoded from the stored text, so every
        number and string is the one hashed); sensitive fields hidden unless ``reveal``."""
        return _frozen(row) if reveal else self._redacted(row)

    def hidden_fields(self, row: Any) -> list[str]:
        """The frozen arguments' fields that the tool marks sensitive (hidden unless revealed).
        A tool this process does not know (an MCP server down, a tools file changed) cannot
        say which are: every field is hidden."""
        tool = self._registry.get(row.tool)
        arguments = _frozen(row)
        return sorted(tool.sensitive_fields.intersection(arguments) if tool is not None else arguments)

    def view_outcome_content(self, row: Any, *, reveal: bool) -> str | None:
        """The executed call's stored answer as an approver reads it: a service that quotes
        a sensitive argument back (the created resource, card number and all) has it taken
        out unless ``reveal`` (audited), as the arguments are."""
        content = row.outcome_content
        hidden = [] if reveal or content is None else self.hidden_fields(row)
        if not hidden:
            return content
        return Sensitive(_frozen(row), hidden).body(content.encode()).decode()

    def _redacted(self, row: Any) -> dict[str, Any]:
        tool = self._registry.get(row.tool)
        arguments = _frozen(row)
        if tool is None:
            return {name: REDACTED for name in arguments}
        return tool.redact(arguments)

    async def _requester(self, row: Any) -> Principal:
        roles = frozenset(row.requester_roles)
        tenant = await self._directory.get(row.tenant_id)
        permissions = TenantDirectory.permissions_for(tenant, roles) if tenant is not None else frozenset()
        return Principal(
            tenant_id=row.tenant_id,
            user_id=row.requester_id,
            roles=roles,
            permissions=permissions,
            tool_policies=tenant.tool_policies if tenant is not None else NO_POLICIES,
        )


def _frozen(row: Any) -> dict[str, Any]:
    """The frozen arguments decoded from the stored text: every number and string as hashed."""
    arguments: dict[str, Any] = msgspec.json.decode(row.canonical_arguments)
    return arguments


def _unexpected(event: str, **fields: Any) -> CallOutcome:
    error_id = new_error_id()
    log.error(event, error_id=error_id, **fields)
    return failure(ErrorCode.TOOL_EXECUTION_FAILED, None, error_id=error_id)


def _now() -> datetime:
    return datetime.now(UTC)
