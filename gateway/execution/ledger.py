"""The run's ledger: budget, repeat counts, tool_call_id replays, approvals and audit rows,
decided atomically in the database.

Two steps per batch, each one database round trip:

1. ``admit``, before anything runs, under the run's row lock: answer ids already seen from
   what is stored when the call is the stored one (same tool, same arguments hash), and
   answer ``TOOL_CALL_ID_CONFLICT`` when it is not; store the outcome of calls the checks rejected; count every other call
   against ``max_tool_calls`` and the repeat limit; create the approval of a call that
   needs one; mark the rest executing. Every outcome decided here is audited in the same
   transaction (the ``gateway_admit_calls`` function, ``gateway/db/sql/admit_calls.sql``).
2. ``record``, after the admitted calls ran: store their outcomes (for replays) and their
   audit rows together, in one statement.

A call of a pure tool (``Tool.pure``) runs before step 1 and comes to it with its outcome:
admitted, it is stored and audited there (decision ``executed``) and needs no step 2.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec
import sqlalchemy as sa

from gateway.audit.rows import AuditRow, append_audit_where, audit_json
from gateway.auth.principal import Principal
from gateway.db.batching import StatementBatcher
from gateway.db.engine import Database
from gateway.db.runs import the_run
from gateway.errors import ErrorCode
from gateway.execution.checks import CallPlan
from gateway.execution.guards import ADMISSION_CONTENTS as LEDGER_CONTENTS, admission_payload
from gateway.execution.runner import CallOutcome


class RunNotFound(Exception):
    """No run with this id belongs to the caller (tenant and user)."""


@dataclass(frozen=True, slots=True)
class Admission:
    tool_call_id: str
    decision: str
    """``execute``: run it now; ``executed``: admitted with the outcome it came with, stored;
    ``decided``: refused, outcome stored; ``replay``: answered from storage."""
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
        self,
        principal: Principal,
        run_id: str,
        plans: list[CallPlan],
        *,
        request_id: str | None,
        now: datetime,
        ran_ahead: Mapping[str, CallOutcome] | None = None,
    ) -> list[Admission]:
        """``ran_ahead``: outcomes of pure calls, by tool_call_id, computed before admission;
        such a call, admitted, is stored and audited with it (decision ``executed``)."""

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
        row = AuditRow(
            tenant_id=principal.tenant_id,
            kind="protocol_rejection",
            outcome=code.value,
            created_at=now,
            user_id=principal.user_id,
            run_id=run_id,
            request_id=request_id,
            detail={"message": message},
        )
        owned_run = sa.exists().where(the_run(run_id, tenant_id=principal.tenant_id, user_id=principal.user_id))
        async with self._db.begin() as conn:
            if not await append_audit_where(conn, row, owned_run):
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
    now: datetime
    stale_before: datetime
    approval_expires_at: datetime
    ran_ahead: Mapping[str, CallOutcome] | None


@dataclass(frozen=True, slots=True)
class _RecordItem:
    principal: Principal
    run_id: str
    finished: list[FinishedCall]
    request_id: str | None
    now: datetime


class PostgresLedger(Ledger):
    """Concurrent requests' admissions go to PostgreSQL together, as do their records
    (``StatementBatcher``): one statement and one commit serve every request in a batch."""

    ADMIT = (
        "SELECT o_batch, o_tool_call_id, o_decision, o_outcome, o_content, o_approval_id, o_approval_status "
        "FROM gateway_admit_calls($1::jsonb, $2::jsonb)"
    )
    RECORD = "SELECT gateway_record_calls($1::jsonb)"
    _contents = msgspec.json.encode(LEDGER_CONTENTS).decode()
    _encoder = msgspec.json.Encoder()

    def __init__(
        self,
        db: Database,
        *,
        approval_ttl: timedelta,
        stale_after: timedelta = DEFAULT_STALE_AFTER,
        lanes: int = 2,
        max_requests: int = 64,
        overflow_after_s: float = 0.005,
    ) -> None:
        super().__init__(db, approval_ttl=approval_ttl, stale_after=stale_after)
        self._admissions: StatementBatcher[_AdmitItem, list[Admission] | None] = StatementBatcher(
            self._admit_many, pool=db.driver_pool, lanes=lanes, max_items=max_requests,
            overflow_after_s=overflow_after_s,
        )
        self._records: StatementBatcher[_RecordItem, None] = StatementBatcher(
            self._record_many, pool=db.driver_pool, even_if_cancelled=True, lanes=lanes, max_items=max_requests,
            overflow_after_s=overflow_after_s,
        )

    async def admit(
        self,
        principal: Principal,
        run_id: str,
        plans: list[CallPlan],
        *,
        request_id: str | None,
        now: datetime,
        ran_ahead: Mapping[str, CallOutcome] | None = None,
    ) -> list[Admission]:
        item = _AdmitItem(
            principal, run_id, plans, request_id, now, now - self._stale_after, self.approval_expiry(now), ran_ahead
        )
        admissions = await self._admissions.submit(item)
        if admissions is None:
            raise RunNotFound(run_id)
        return admissions

    async def record(
        self, principal: Principal, run_id: str, finished: list[FinishedCall], *, request_id: str | None, now: datetime
    ) -> None:
        await self._records.submit(_RecordItem(principal, run_id, finished, request_id, now))

    async def close(self) -> None:
        await self._admissions.close()
        await self._records.close()

    async def _admit_many(self, conn: Any, items: Sequence[_AdmitItem]) -> list[list[Admission] | None]:
        # Runs are locked in the order given: sorting by run id keeps every statement's order the same.
        order = sorted(range(len(items)), key=lambda i: items[i].run_id)
        batches = [
            {
                # Every time rule of the batch is decided at the time its request was given.
                "audit": audit_json(
                    tenant_id=items[i].principal.tenant_id,
                    user_id=items[i].principal.user_id,
                    run_id=items[i].run_id,
                    request_id=items[i].request_id,
                    created_at=items[i].now,
                ),
                "roles": sorted(items[i].principal.roles),
                "stale_before": items[i].stale_before.isoformat(),
                "approval_expires_at": items[i].approval_expires_at.isoformat(),
                "calls": [admission_payload(plan, _ran_ahead(items[i], plan)) for plan in items[i].plans],
            }
            for i in order
        ]
        rows = await conn.fetch(self.ADMIT, self._encoder.encode(batches).decode(), self._contents)
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
                    "content": f.content,
                    "audit": audit_json(
                        tenant_id=item.principal.tenant_id,
                        kind="tool_call",
                        outcome=f.outcome,
                        created_at=item.now,
                        user_id=item.principal.user_id,
                        run_id=item.run_id,
                        tool_call_id=f.plan.id,
                        tool=f.plan.request.name,
                        arguments=f.plan.audit_arguments,
                        arguments_sha256=f.plan.arguments_sha256,
                        duration_ms=f.duration_ms,
                        request_id=item.request_id,
                        error_id=f.error_id,
                    ),
                }
                for item in items
                for f in item.finished
            ]
        ).decode()
        await conn.execute(self.RECORD, rows)
        return [None] * len(items)


def _ran_ahead(item: _AdmitItem, plan: CallPlan) -> CallOutcome | None:
    return item.ran_ahead.get(plan.id) if item.ran_ahead else None


def create_ledger(
    db: Database,
    *,
    approval_ttl: timedelta,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
    lanes: int = 2,
    max_requests: int = 64,
    overflow_after_s: float = 0.005,
) -> Ledger:
    return PostgresLedger(
        db, approval_ttl=approval_ttl, stale_after=stale_after, lanes=lanes, max_requests=max_requests,
        overflow_after_s=overflow_after_s,
    )
