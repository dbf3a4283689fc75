"""The run's ledger: budget, repeat counts, tool_call_id replays, approvals and audit rows,
decided atomically in the database.

Two steps per batch, each one database round trip on PostgreSQL:

1. ``admit``, before anything runs, under the run's row lock: answer ids already seen from
   what is stored when the call is the stored one (same tool, same arguments hash), and
   answer ``TOOL_CALL_ID_CONFLICT`` when it is not; store the outcome of calls the checks rejected; count every other call
   against ``max_tool_calls`` and the repeat limit; create the approval of a call that
   needs one; mark the rest executing. Every outcome decided here is audited in the same
   transaction. (PostgreSQL: the ``gateway_admit_calls`` function, migration 0006.)
2. ``record``, after the admitted calls ran: store their outcomes (for replays) and their
   audit rows together, in one statement.

``SqliteLedger`` is the same logic in Python inside a ``BEGIN IMMEDIATE`` transaction;
the ledger tests run the same cases against both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.auth.principal import Principal
from gateway.db.batching import StatementBatcher
from gateway.db.engine import Database
from gateway.db.models import Approval, AuditEvent, Run, RunCallCount, ToolCall
from gateway.errors import ErrorCode
from gateway.execution.checks import CallPlan
from gateway.execution.guards import ADMISSION_CONTENTS as LEDGER_CONTENTS, admission_payload
from gateway.execution.guards.tool_budget import CONTENT_KEY as TOOL_BUDGET_EXCEEDED


class RunNotFound(Exception):
    """No run with this id belongs to the caller (tenant and user)."""


@dataclass(frozen=True, slots=True)
class Admission:
    tool_call_id: str
    decision: str
    """``execute``: run it now; ``decided``: outcome stored; ``replay``: answered from storage."""
    outcome: str | None = None
    content: str | None = None
    approval_id: str | None = None
    approval_status: str | None = None


@dataclass(frozen=True, slots=True)
class FinishedCall:
    plan: CallPlan
    outcome: str
    content: str
    duration_ms: float
    error_id: str | None = None


DEFAULT_STALE_AFTER = timedelta(minutes=20)


class Ledger(ABC):
    def __init__(self, db: Database, *, approval_ttl: timedelta, stale_after: timedelta = DEFAULT_STALE_AFTER) -> None:
        """``stale_after``: longer than any call can run; a call still marked executing after
        that was interrupted (its process stopped) and its outcome is unknown."""
        self._db = db
        self._approval_ttl = approval_ttl
        self._stale_after = stale_after

    @abstractmethod
    async def admit(
        self, principal: Principal, run_id: str, plans: list[CallPlan], *, request_id: str | None, now: datetime
    ) -> list[Admission]: ...

    @abstractmethod
    async def record(
        self, principal: Principal, run_id: str, finished: list[FinishedCall], *, request_id: str | None, now: datetime
    ) -> None: ...

    async def reject_batch(
        self,
        principal: Principal,
        run_id: str,
        code: ErrorCode,
        message: str,
        *,
        request_id: str | None,
        now: datetime,
    ) -> None:
        """Audit a batch refused for breaking the protocol; nothing else is stored."""
        audit = AuditEvent.__table__
        runs = Run.__table__
        owned_run = sa.select(
            sa.literal(principal.tenant_id),
            sa.literal("protocol_rejection"),
            sa.literal(principal.user_id),
            runs.c.id,
            sa.literal(code.value),
            sa.literal(request_id, sa.String),
            sa.literal({"message": message}, AuditEvent.detail.type),
            sa.literal(now, AuditEvent.created_at.type),
        ).where(runs.c.id == run_id, runs.c.tenant_id == principal.tenant_id, runs.c.user_id == principal.user_id)
        stmt = audit.insert().from_select(
            ["tenant_id", "kind", "user_id", "run_id", "outcome", "request_id", "detail", "created_at"], owned_run
        )
        async with self._db.begin() as conn:
            result = await conn.execute(stmt)
        if result.rowcount == 0:
            raise RunNotFound(run_id)

    def approval_expiry(self, now: datetime) -> datetime:
        return now + self._approval_ttl

    async def close(self) -> None:
        """Stop background work (nothing to stop by default)."""


@dataclass(frozen=True, slots=True)
class _AdmitItem:
    principal: Principal
    run_id: str
    plans: list[CallPlan]
    request_id: str | None
    approval_expires_at: datetime


@dataclass(frozen=True, slots=True)
class _RecordItem:
    principal: Principal
    run_id: str
    finished: list[FinishedCall]
    request_id: str | None


class PostgresLedger(Ledger):
    """Concurrent requests' admissions go to PostgreSQL together, as do their records
    (``StatementBatcher``): one statement and one commit serve every request in a batch."""

    ADMIT = (
        "SELECT o_batch, o_tool_call_id, o_decision, o_outcome, o_content, o_approval_id, o_approval_status "
        "FROM gateway_admit_calls($1, $2::jsonb, $3::jsonb, $4)"
    )
    RECORD = "SELECT gateway_record_calls($1, $2::jsonb)"
    _contents = msgspec.json.encode(LEDGER_CONTENTS).decode()
    _encoder = msgspec.json.Encoder()

    def __init__(self, db: Database, *, approval_ttl: timedelta, stale_after: timedelta = DEFAULT_STALE_AFTER) -> None:
        super().__init__(db, approval_ttl=approval_ttl, stale_after=stale_after)
        self._admissions: StatementBatcher[_AdmitItem, list[Admission] | None] = StatementBatcher(
            self._admit_many, pool=db.driver_pool
        )
        self._records: StatementBatcher[_RecordItem, None] = StatementBatcher(
            self._record_many, pool=db.driver_pool, even_if_cancelled=True
        )

    async def admit(
        self, principal: Principal, run_id: str, plans: list[CallPlan], *, request_id: str | None, now: datetime
    ) -> list[Admission]:
        item = _AdmitItem(principal, run_id, plans, request_id, self.approval_expiry(now))
        admissions = await self._admissions.submit(item)
        if admissions is None:
            raise RunNotFound(run_id)
        return admissions

    async def record(
        self, principal: Principal, run_id: str, finished: list[FinishedCall], *, request_id: str | None, now: datetime
    ) -> None:
        await self._records.submit(_RecordItem(principal, run_id, finished, request_id))

    async def close(self) -> None:
        await self._admissions.close()
        await self._records.close()

    async def _admit_many(self, conn: Any, items: Sequence[_AdmitItem]) -> list[list[Admission] | None]:
        # Runs are locked in the order given: sorting by run id keeps every statement's order the same.
        order = sorted(range(len(items)), key=lambda i: items[i].run_id)
        batches = [
            {
                "run_id": items[i].run_id,
                "tenant_id": items[i].principal.tenant_id,
                "user_id": items[i].principal.user_id,
                "roles": sorted(items[i].principal.roles),
                "request_id": items[i].request_id,
                "approval_expires_at": items[i].approval_expires_at.isoformat(),
                "calls": [admission_payload(plan) for plan in items[i].plans],
            }
            for i in order
        ]
        now = datetime.now(UTC)
        rows = await conn.fetch(
            self.ADMIT, now, self._encoder.encode(batches).decode(), self._contents, now - self._stale_after
        )
        grouped: list[list[Admission] | None] = [[] for _ in items]
        for row in rows:
            position = order[row[0]]
            if row[2] == "no_run":
                grouped[position] = None
            else:
                admissions = grouped[position]
                assert admissions is not None
                admissions.append(Admission(*row[1:]))
        return grouped

    async def _record_many(self, conn: Any, items: Sequence[_RecordItem]) -> list[None]:
        rows = self._encoder.encode(
            [
                {
                    "run_id": item.run_id,
                    "tenant_id": item.principal.tenant_id,
                    "user_id": item.principal.user_id,
                    "request_id": item.request_id,
                    "tool_call_id": f.plan.id,
                    "tool": f.plan.request.name,
                    "outcome": f.outcome,
                    "content": f.content,
                    "duration_ms": f.duration_ms,
                    "error_id": f.error_id,
                    "audit_args": f.plan.audit_arguments,
                    "args_sha256": f.plan.arguments_sha256,
                }
                for item in items
                for f in item.finished
            ]
        ).decode()
        await conn.execute(self.RECORD, datetime.now(UTC), rows)
        return [None] * len(items)


_runs = Run.__table__
_counts = RunCallCount.__table__
_calls = ToolCall.__table__
_approvals = Approval.__table__
_audit = AuditEvent.__table__


def _replayed_outcome(stored: Any, approval: Any, now: datetime, stale_before: datetime) -> str:
    if stored.outcome is not None:
        return str(stored.outcome)
    if approval is None:
        if stored.created_at < stale_before:  # started long ago, never recorded: interrupted
            return ErrorCode.TOOL_OUTCOME_UNKNOWN.value
        return ErrorCode.TOOL_CALL_IN_PROGRESS.value
    if approval.status == "pending" and approval.expires_at > now:
        return ErrorCode.APPROVAL_REQUIRED.value
    if approval.status in ("pending", "expired"):
        return ErrorCode.APPROVAL_EXPIRED.value
    if approval.status == "rejected":
        return ErrorCode.APPROVAL_REJECTED.value
    if approval.decided_at is not None and approval.decided_at < stale_before:
        return ErrorCode.TOOL_OUTCOME_UNKNOWN.value
    return ErrorCode.TOOL_CALL_IN_PROGRESS.value


class SqliteLedger(Ledger):
    async def admit(
        self, principal: Principal, run_id: str, plans: list[CallPlan], *, request_id: str | None, now: datetime
    ) -> list[Admission]:
        async with self._db.begin() as conn:
            run = (
                await conn.execute(
                    sa.select(_runs).where(
                        _runs.c.id == run_id,
                        _runs.c.tenant_id == principal.tenant_id,
                        _runs.c.user_id == principal.user_id,
                    )
                )
            ).first()
            if run is None:
                raise RunNotFound(run_id)
            used = run.used_tool_calls
            admissions = []
            audit_rows: list[dict[str, Any]] = []
            for plan in plans:
                admission, used = await self._admit_one(conn, principal, run, used, plan, now=now)
                admissions.append(admission)
                if admission.decision != "execute":
                    audit_rows.append(
                        _audit_row(
                            principal,
                            run_id,
                            plan,
                            kind="tool_call_replay" if admission.decision == "replay" else "tool_call",
                            outcome=admission.outcome or "",
                            approval_id=admission.approval_id,
                            request_id=request_id,
                            now=now,
                        )
                    )
            if used != run.used_tool_calls:
                await conn.execute(sa.update(_runs).where(_runs.c.id == run_id).values(used_tool_calls=used))
            if audit_rows:
                await conn.execute(_audit.insert(), audit_rows)
        return admissions

    async def _admit_one(
        self, conn: AsyncConnection, principal: Principal, run: Any, used: int, plan: CallPlan, *, now: datetime
    ) -> tuple[Admission, int]:
        stored = (
            await conn.execute(sa.select(_calls).where(_calls.c.run_id == run.id, _calls.c.tool_call_id == plan.id))
        ).first()
        if stored is not None:
            approval = None
            if stored.outcome is None and stored.approval_id is not None:
                approval = (
                    await conn.execute(sa.select(_approvals).where(_approvals.c.id == stored.approval_id))
                ).first()
            return (
                Admission(
                    tool_call_id=plan.id,
                    decision="replay",
                    outcome=_replayed_outcome(stored, approval, now, now - self._stale_after),
                    content=stored.content,
                    approval_id=stored.approval_id,
                    approval_status=approval.status if approval is not None else None,
                ),
                used,
            )

        base = {"run_id": run.id, "tool_call_id": plan.id, "tenant_id": principal.tenant_id,
                "tool": plan.request.name, "created_at": now}
        if plan.rejected is not None:
            code, content = plan.rejected.value, plan.rejection_content
        elif run.expires_at is not None and run.expires_at <= now:
            code, content = ErrorCode.RUN_EXPIRED.value, LEDGER_CONTENTS[ErrorCode.RUN_EXPIRED.value]
        elif used >= run.max_tool_calls:
            code, content = ErrorCode.BUDGET_EXCEEDED.value, LEDGER_CONTENTS[ErrorCode.BUDGET_EXCEEDED.value]
        else:
            used += 1
            count = await self._count(conn, run.id, plan.call_hash or "")
            tool_count = (
                await self._count(conn, run.id, "tool:" + plan.request.name) if plan.tool_call_cap is not None else 0
            )
            if plan.tool_call_cap is not None and tool_count > plan.tool_call_cap:
                code, content = ErrorCode.BUDGET_EXCEEDED.value, LEDGER_CONTENTS[TOOL_BUDGET_EXCEEDED]
            elif count > run.max_repeats:
                code, content = ErrorCode.REPEATED_CALL.value, LEDGER_CONTENTS[ErrorCode.REPEATED_CALL.value]
            elif plan.needs_approval:
                assert plan.arguments is not None and plan.approval_id is not None
                await conn.execute(
                    _approvals.insert().values(
                        id=plan.approval_id,
                        tenant_id=principal.tenant_id,
                        run_id=run.id,
                        tool_call_id=plan.id,
                        requester_id=principal.user_id,
                        requester_roles=sorted(principal.roles),
                        tool=plan.request.name,
                        arguments=msgspec.json.decode(plan.arguments.canonical),
                        arguments_sha256=plan.arguments_sha256,
                        status="pending",
                        created_at=now,
                        expires_at=self.approval_expiry(now),
                    )
                )
                await conn.execute(_calls.insert().values(**base, status="approval", approval_id=plan.approval_id))
                return (
                    Admission(
                        tool_call_id=plan.id,
                        decision="decided",
                        outcome=ErrorCode.APPROVAL_REQUIRED.value,
                        approval_id=plan.approval_id,
                        approval_status="pending",
                    ),
                    used,
                )
            else:
                await conn.execute(_calls.insert().values(**base, status="executing"))
                return Admission(tool_call_id=plan.id, decision="execute"), used

        await conn.execute(
            _calls.insert().values(**base, status="done", outcome=code, content=content, finished_at=now)
        )
        return Admission(tool_call_id=plan.id, decision="decided", outcome=code, content=content), used

    @staticmethod
    async def _count(conn: AsyncConnection, run_id: str, call_hash: str) -> int:
        updated = await conn.execute(
            sa.update(_counts)
            .where(_counts.c.run_id == run_id, _counts.c.call_hash == call_hash)
            .values(count=_counts.c.count + 1)
            .returning(_counts.c.count)
        )
        count = updated.scalar()
        if count is None:
            await conn.execute(_counts.insert().values(run_id=run_id, call_hash=call_hash, count=1))
            return 1
        return int(count)

    async def record(
        self, principal: Principal, run_id: str, finished: list[FinishedCall], *, request_id: str | None, now: datetime
    ) -> None:
        async with self._db.begin() as conn:
            for f in finished:
                await conn.execute(
                    sa.update(_calls)
                    .where(_calls.c.run_id == run_id, _calls.c.tool_call_id == f.plan.id)
                    .values(status="done", outcome=f.outcome, content=f.content, finished_at=now)
                )
            await conn.execute(
                _audit.insert(),
                [
                    _audit_row(
                        principal,
                        run_id,
                        f.plan,
                        kind="tool_call",
                        outcome=f.outcome,
                        request_id=request_id,
                        now=now,
                        duration_ms=f.duration_ms,
                        error_id=f.error_id,
                    )
                    for f in finished
                ],
            )


def _audit_row(
    principal: Principal,
    run_id: str,
    plan: CallPlan,
    *,
    kind: str,
    outcome: str,
    request_id: str | None,
    now: datetime,
    approval_id: str | None = None,
    duration_ms: float | None = None,
    error_id: str | None = None,
) -> dict[str, Any]:
    return {
        "tenant_id": principal.tenant_id,
        "kind": kind,
        "user_id": principal.user_id,
        "run_id": run_id,
        "tool_call_id": plan.id,
        "tool": plan.request.name,
        "arguments": plan.audit_arguments_value(),
        "arguments_sha256": plan.arguments_sha256,
        "outcome": outcome,
        "duration_ms": duration_ms,
        "approval_id": approval_id,
        "request_id": request_id,
        "error_id": error_id,
        "detail": None,
        "created_at": now,
    }


def create_ledger(db: Database, *, approval_ttl: timedelta, stale_after: timedelta = DEFAULT_STALE_AFTER) -> Ledger:
    return (PostgresLedger if db.is_postgres else SqliteLedger)(db, approval_ttl=approval_ttl, stale_after=stale_after)
