"""A tool call that runs inside one transaction with its recorded outcome and audit row.

Used for calls of tools that change data: an approved call (``approvals.py``), and a call
the tenant's policy admits without approval (``CallPlan.transactional``). The handler gets
the transaction through ``ToolContext.transaction``; its writes are kept only when it
succeeds (a savepoint), and the outcome and audit row commit with them. If anything fails
around the call (recording it included), the transaction rolls back, the call's writes
with it, and the failure is recorded durably in a transaction of its own.
"""

from __future__ import annotations

import asyncio

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.rows import AuditRow, append_audit
from gateway.auth.principal import Principal
from gateway.db import approvals as q
from gateway.db.engine import Database
from gateway.errors import ErrorCode
from gateway.errors import new_error_id
from gateway.execution.policy import ToolLimits
from gateway.execution.results import error_detail
from gateway.execution.runner import CallOutcome, failed, run_tool
from gateway.settings import Settings
from gateway.tools.base import DecodedArguments, Tool, ToolContext

log = structlog.get_logger("gateway.execution")

Recorder = Callable[[AsyncConnection, CallOutcome], Awaitable[None]]
"""Stores the call's outcome and audit row on the call's own transaction."""


def failure(code: ErrorCode, message: str | None, *, error_id: str | None = None) -> CallOutcome:
    return failed(error_detail(code, message, error_id=error_id), 0.0)


class TransactionalCalls:
    def __init__(self, *, settings: Settings, db: Database) -> None:
        self._settings = settings
        self._db = db

    async def record_only(self, outcome: CallOutcome, record: Recorder) -> CallOutcome:
        """A call decided without running (refused at execution time): record it."""
        async with self._db.begin() as conn:
            await record(conn, outcome)
        return outcome

    async def run(
        self,
        tool: Tool,
        arguments: DecodedArguments,
        *,
        limits: ToolLimits,
        principal: Principal,
        run_id: str,
        tool_call_id: str,
        request_id: str | None,
        record: Recorder,
        idempotency_key: str | None = None,
        log_fields: dict[str, Any] | None = None,
    ) -> CallOutcome:
        async def call(transaction: AsyncConnection | None) -> CallOutcome:
            ctx = ToolContext(
                principal=principal,
                run_id=run_id,
                tool_call_id=tool_call_id,
                request_id=request_id,
                db=self._db,
                idempotency_key=idempotency_key,
                transaction=transaction,
            )
            return await run_tool(
                tool,
                arguments,
                ctx,
                limits=limits,
                default_timeout_s=self._settings.tools.timeout_s,
                default_max_result_bytes=self._settings.tools.max_result_bytes,
            )

        async def record_alone(outcome: CallOutcome) -> None:
            async with self._db.begin() as conn:
                await record(conn, outcome)

        async def record_cancelled() -> None:
            # Cancelled (client gone, run deadline, shutdown) before the call finished: say so
            # durably, as for any call, or its replays report it in progress, and no audit row
            # tells of it. Shielded: the record lands even if this task is cancelled again.
            log.warning("transactional_call_cancelled", tool=tool.name, tool_call_id=tool_call_id, run=run_id,
                        **(log_fields or {}))
            await asyncio.shield(self.record_unless_finished(
                principal.tenant_id, run_id, tool_call_id, record, failure(ErrorCode.TOOL_CALL_CANCELLED, None)
            ))

        if tool.remote:
            # A tool whose effects live elsewhere (a business service behind HTTP): nothing of
            # its work can join our transaction, so it runs with none open — holding one across a
            # remote call would keep a connection (and its locks) for its whole duration.
            # Its outcome and audit row then commit together.
            try:
                outcome = await call(None)
            except asyncio.CancelledError:
                await record_cancelled()
                raise
            # The service answered: its outcome is recorded whatever happens to this task now.
            await asyncio.shield(record_alone(outcome))
            return outcome
        try:
            async with self._db.begin() as conn:
                savepoint = await conn.begin_nested()
                outcome = await call(conn)
                if outcome.ok:
                    await savepoint.commit()
                else:
                    await savepoint.rollback()
                await record(conn, outcome)
        except asyncio.CancelledError:
            # The call's writes are rolled back with the transaction.
            await record_cancelled()
            raise
        except Exception:
            # The call's writes are rolled back with the transaction; say so durably.
            error_id = new_error_id()
            log.exception("transactional_call_failed", tool=tool.name, tool_call_id=tool_call_id, run=run_id,
                          error_id=error_id, **(log_fields or {}))
            return await self.record_failure(principal.tenant_id, run_id, tool_call_id, record, error_id)
        return outcome

    async def record_failure(
        self, tenant_id: str, run_id: str, tool_call_id: str, record: Recorder, error_id: str
    ) -> CallOutcome:
        """Record TOOL_EXECUTION_FAILED for a call whose transaction raised, its writes rolled
        back — unless the raise came after its COMMIT reached the database (the connection
        lost on the way back): then the outcome it stored stands, audited once, and this answer
        can only say the outcome is unknown (a replay of the call answers the stored one)."""
        failed = failure(ErrorCode.TOOL_EXECUTION_FAILED, None, error_id=error_id)
        if await self.record_unless_finished(tenant_id, run_id, tool_call_id, record, failed):
            return failed
        return failure(ErrorCode.TOOL_OUTCOME_UNKNOWN, None, error_id=error_id)

    async def record_unless_finished(
        self, tenant_id: str, run_id: str, tool_call_id: str, record: Recorder, outcome: CallOutcome
    ) -> bool:
        """Record ``outcome`` unless the call has one already: a cancellation that lands while
        the call's own transaction commits (the database committed, its answer not yet read)
        must not overwrite the outcome it stored, nor audit the call twice."""
        async with self._db.begin() as conn:
            if await q.call_is_finished(conn, tenant_id=tenant_id, run_id=run_id, tool_call_id=tool_call_id):
                return False
            await record(conn, outcome)
        return True

    async def run_plan(
        self, principal: Principal, run_id: str, plan: Any, *, request_id: str | None
    ) -> CallOutcome:
        """Run a ``CallPlan`` the ledger admitted (``plan.transactional``): its writes, its
        stored outcome (answered to replays) and its audit row commit together. The caller
        must not record it again."""
        assert plan.tool is not None and plan.arguments is not None

        async def record(conn: AsyncConnection, outcome: CallOutcome) -> None:
            now = datetime.now(UTC)
            await q.store_call_outcome(
                conn, tenant_id=principal.tenant_id, run_id=run_id, tool_call_id=plan.id, outcome=outcome.outcome,
                content=outcome.content, now=now,
            )
            await append_audit(
                conn,
                AuditRow(
                    tenant_id=principal.tenant_id,
                    kind="tool_call",
                    outcome=outcome.outcome,
                    created_at=now,
                    user_id=principal.user_id,
                    run_id=run_id,
                    tool_call_id=plan.id,
                    tool=plan.request.name,
                    arguments=plan.audit_arguments_value(),
                    arguments_sha256=plan.arguments_sha256,
                    duration_ms=outcome.duration_ms,
                    request_id=request_id,
                    error_id=outcome.error_id,
                ),
            )

        return await self.run(
            plan.tool,
            plan.arguments,
            limits=plan.limits,
            principal=principal,
            run_id=run_id,
            tool_call_id=plan.id,
            request_id=request_id,
            record=record,
        )
