"""The guarded executor: a model's tool calls in, one ``role=tool`` message per call out.

The guards, in the order the model sees their codes, are one list: ``gateway.execution.guards``.
A batch goes through them in four steps:

1. protocol: the batch as a whole (``INVALID_TOOL_CALL``, ``DUPLICATE_TOOL_CALL_ID``) — protocol.py
2. per call, no database: the check guards — checks.py
3. one atomic database step for the whole batch: replays of known ids, then the admission
   guards — ledger.py
4. execution, concurrently, inside the execution guards: business codes,
   ``TOOL_EXECUTION_FAILED`` — runner.py (a ``local`` tool, one that does no I/O, runs
   inline: a timeout cannot interrupt it and there is nothing to overlap)
5. outcomes and audit rows stored in one statement — ledger.py

A pure call (``Tool.pure``: local and changing nothing) runs before step 3 instead of in
step 4, and its outcome goes to the admission statement, which stores and audits it if the
call is admitted (and drops it if not): such a call costs one statement, not two.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
import structlog

from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.execution.checks import CallPlan, plan_calls
from gateway.execution.guards import ADMISSION_CONTENTS
from gateway.execution.ledger import Admission, FinishedCall, Ledger, RunNotFound
from gateway.execution.protocol import ProtocolError, ToolCallRequest, parse_batch
from gateway.execution.results import ErrorDetail, detail_content, error_content, error_detail, read_content
from gateway.execution.runner import OK, CallOutcome, run_tool
from gateway.execution.transactional import TransactionalCalls
from gateway.observability.metrics import Metrics
from gateway.observability.timing import AUDIT, BUDGET, TOOL, UNTIMED, VALIDATION, StageTimer
from gateway.settings import Settings
from gateway.tools.base import Tool, ToolContext
from gateway.tools.registry import ToolRegistry

log = structlog.get_logger("gateway.execution")


@dataclass(frozen=True, slots=True)
class ToolMessage:
    tool_call_id: str
    content: str
    """What the model is told (JSON text)."""
    outcome: str
    error: ErrorDetail | None = None
    """What ``content`` says when the call did not succeed (code, message, retryable, ...): read
    this, never ``content``."""
    role: str = "tool"

    @property
    def approval_id(self) -> str | None:
        """The approval this call waits for (``APPROVAL_REQUIRED``), as ``content`` names it."""
        return self.error.approval_id if self.error is not None else None


class ToolExecutor:
    def __init__(
        self, *, settings: Settings, db: Database, registry: ToolRegistry, ledger: Ledger, metrics: Metrics
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._db = db
        self._registry = registry
        self._ledger = ledger
        self._transactional = TransactionalCalls(settings=settings, db=db)

    async def execute_body(
        self,
        principal: Principal,
        run_id: str,
        body: bytes,
        *,
        request_id: str | None,
        timer: StageTimer = UNTIMED,
    ) -> list[ToolMessage]:
        """Execute a raw ``{"tool_calls": [...]}`` body; protocol errors raise ``GatewayError`` (422)."""
        timer.begin()
        try:
            limits = self._settings.requests
            requests = parse_batch(body, max_batch_size=limits.max_batch_size, max_json_depth=limits.max_json_depth)
        except ProtocolError as exc:
            timer.lap(VALIDATION)
            raise await self._rejection(principal, run_id, exc, request_id=request_id) from None
        timer.lap(VALIDATION)
        return await self.execute(principal, run_id, requests, request_id=request_id, timer=timer)

    async def _rejection(
        self, principal: Principal, run_id: str, exc: ProtocolError, *, request_id: str | None
    ) -> GatewayError:
        """Audit the refused batch and return the 422 to raise (or raise 404 for a foreign run)."""
        try:
            await self._ledger.reject_batch(
                principal, run_id, exc.code, exc.message, request_id=request_id, now=datetime.now(UTC)
            )
        except RunNotFound:
            raise GatewayError(ErrorCode.NOT_FOUND, "No such run.") from None
        log.info("tool_batch_rejected", run=run_id, outcome=exc.code.value)
        return GatewayError(exc.code, exc.message)

    async def execute(
        self,
        principal: Principal,
        run_id: str,
        requests: list[ToolCallRequest],
        *,
        request_id: str | None,
        timer: StageTimer = UNTIMED,
    ) -> list[ToolMessage]:
        plans = plan_calls(
            self._registry, principal, requests, timer, max_json_depth=self._settings.requests.max_json_depth
        )
        ran_ahead = await self._run_ahead(principal, run_id, plans, request_id)
        if ran_ahead:
            timer.lap(TOOL)
        now = datetime.now(UTC)
        try:
            admissions = await self._ledger.admit(
                principal, run_id, plans, request_id=request_id, now=now, ran_ahead=ran_ahead
            )
        except RunNotFound:
            raise GatewayError(ErrorCode.NOT_FOUND, "No such run.") from None
        timer.lap(BUDGET)

        to_run = [plan for plan, adm in zip(plans, admissions, strict=True) if adm.decision == "execute"]
        begun: set[str] = set()
        try:
            outcomes = await self._run_all(principal, run_id, to_run, request_id, begun) if to_run else {}
        except asyncio.CancelledError:
            # A call that changes data without approval and had begun records its own
            # cancellation with its transaction; every other call is recorded here.
            unrecorded = [plan for plan in to_run if not (plan.transactional and plan.id in begun)]
            await self._record_cancelled(principal, run_id, unrecorded, request_id)
            raise
        timer.lap(TOOL)
        # A call that changes data without approval recorded itself with its writes.
        to_record = [plan for plan in to_run if not plan.transactional]
        if to_record:
            finished = [
                FinishedCall(
                    plan=plan,
                    outcome=outcomes[plan.id].outcome,
                    content=outcomes[plan.id].content,
                    duration_ms=outcomes[plan.id].duration_ms,
                    error_id=outcomes[plan.id].error_id,
                )
                for plan in to_record
            ]
            await self._ledger.record(principal, run_id, finished, request_id=request_id, now=datetime.now(UTC))
            timer.lap(AUDIT)

        messages = []
        for plan, admission in zip(plans, admissions, strict=True):
            decision = admission.decision
            if decision == "executed":  # ran ahead, admitted: stored with what it computed
                outcomes[plan.id] = ran_ahead[plan.id]
                decision = "execute"
            ran = outcomes.get(plan.id)
            if ran is not None:
                message = ToolMessage(tool_call_id=plan.id, content=ran.content, outcome=ran.outcome, error=ran.error)
            else:
                message = message_of(plan.id, admission)
            messages.append(message)
            self._metrics.call_answered(
                plan.tool.name if plan.tool is not None else None,
                decision,
                message.outcome,
                ran.duration_ms if ran is not None else None,
            )
            log.info(
                "tool_call_finished",
                run=run_id,
                tool=plan.request.name,
                tool_call_id=plan.id,
                outcome=message.outcome,
                decision=decision,
                duration_ms=ran.duration_ms if ran is not None else None,
            )
        return messages

    def refused(self, principal: Principal, requests: list[ToolCallRequest]) -> list[ToolCallRequest]:
        """The calls the checks refuse before any database step (a protocol problem, an
        unknown tool, no permission, bad arguments): executing these runs nothing, it answers
        and audits each with its code."""
        plans = plan_calls(
            self._registry, principal, requests, max_json_depth=self._settings.requests.max_json_depth
        )
        return [plan.request for plan in plans if plan.rejected is not None]

    async def _run_ahead(
        self, principal: Principal, run_id: str, plans: list[CallPlan], request_id: str | None
    ) -> dict[str, CallOutcome]:
        """Run the batch's pure calls that passed the checks (an approval or a refusal can
        still come; their outcomes are then dropped)."""
        outcomes: dict[str, CallOutcome] = {}
        for plan in plans:
            tool = plan.tool
            if tool is not None and tool.pure and plan.rejected is None and not plan.needs_approval:
                outcomes[plan.id] = await self._run(principal, run_id, plan, request_id)
        return outcomes

    async def _record_cancelled(
        self, principal: Principal, run_id: str, plans: list[CallPlan], request_id: str | None
    ) -> None:
        """The request was cancelled while its calls ran: say so for each, in storage and audit,
        so a replay does not report them in progress forever."""
        content = error_content(ErrorCode.TOOL_CALL_CANCELLED)
        cancelled = [
            FinishedCall(plan=plan, outcome=ErrorCode.TOOL_CALL_CANCELLED.value, content=content, duration_ms=0.0)
            for plan in plans
        ]
        if cancelled:
            # Shielded: the record lands even if this task is cancelled again meanwhile.
            await asyncio.shield(
                self._ledger.record(principal, run_id, cancelled, request_id=request_id, now=datetime.now(UTC))
            )
        log.warning("tool_calls_cancelled", run=run_id, calls=len(plans))

    async def _run_all(
        self, principal: Principal, run_id: str, plans: list[CallPlan], request_id: str | None, begun: set[str]
    ) -> dict[str, CallOutcome]:
        """Run the admitted calls of a batch concurrently: calls that wait on I/O as tasks,
        local ones (no I/O, so nothing to overlap) inline while the tasks wait."""
        waiting = [plan for plan in plans if not _tool(plan).local]
        outcomes: dict[str, CallOutcome] = {}
        if len(waiting) == 1 and len(plans) == 1:
            outcomes[waiting[0].id] = await self._run(principal, run_id, waiting[0], request_id, begun)
            return outcomes
        tasks = [asyncio.ensure_future(self._run(principal, run_id, plan, request_id, begun)) for plan in waiting]
        try:
            for plan in plans:
                if _tool(plan).local:
                    outcomes[plan.id] = await self._run(principal, run_id, plan, request_id, begun)
            if tasks:
                for plan, outcome in zip(waiting, await asyncio.gather(*tasks), strict=True):
                    outcomes[plan.id] = outcome
        finally:
            for task in tasks:
                task.cancel()
        return outcomes

    async def _run(
        self, principal: Principal, run_id: str, plan: CallPlan, request_id: str | None, begun: set[str] | None = None
    ) -> CallOutcome:
        """``begun``: gets the ids of transactional calls as they start (each then records
        its own outcome, a cancellation included)."""
        assert plan.tool is not None and plan.arguments is not None
        if plan.transactional:
            if begun is not None:
                begun.add(plan.id)
            return await self._transactional.run_plan(principal, run_id, plan, request_id=request_id)
        ctx = ToolContext(
            principal=principal, run_id=run_id, tool_call_id=plan.id, request_id=request_id, db=self._db
        )
        return await run_tool(
            plan.tool,
            plan.arguments,
            ctx,
            limits=plan.limits,
            default_timeout_s=self._settings.tools.timeout_s,
            default_max_result_bytes=self._settings.tools.max_result_bytes,
        )


def _tool(plan: CallPlan) -> Tool:
    assert plan.tool is not None
    return plan.tool


def message_of(tool_call_id: str, admission: Admission) -> ToolMessage:
    """What the model is told for a call the ledger decided or replayed."""
    outcome = admission.outcome or ""
    if admission.content is not None:
        # Stored text (a refusal, a replayed outcome): read back once, here.
        error = None if outcome == OK else _error_of(admission.content)
        return ToolMessage(tool_call_id=tool_call_id, content=admission.content, outcome=outcome, error=error)
    code = ErrorCode(admission.outcome) if admission.outcome else ErrorCode.TOOL_CALL_IN_PROGRESS
    detail = error_detail(code, approval_id=admission.approval_id)
    return ToolMessage(tool_call_id=tool_call_id, content=detail_content(detail), outcome=outcome, error=detail)


_FIXED_ERRORS = {content: read_content(content).error for content in ADMISSION_CONTENTS.values()}
"""The ledger's fixed refusals, read once."""


def _error_of(content: str) -> ErrorDetail | None:
    fixed = _FIXED_ERRORS.get(content)
    if fixed is not None:
        return fixed
    try:
        return read_content(content).error
    except msgspec.DecodeError:  # not written by results.py; the model still gets it as it is
        return None
