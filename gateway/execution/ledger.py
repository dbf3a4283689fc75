"""The run's ledger: budget, repeat counts, tool_call_id replays, approvals and audit rows,
decided atomically in the database.

Two steps per batch, each one database round trip:

1. ``admit``, before anything runs, under the run's row lock: answer ids already seen from
   what is stored when the call is the stored one (same tool, same arguments hash), and
   answer ``TOOL_CALL_ID_CONFLICT`` when it is not; store the outcome of calls the checks rejected; count every other call
   against ``max_tool_calls`` and the repeat limit; create the approval of a call that
   needs one; mark the rest executing. Every outcome decided here is audited in the same
   transaction (``gateway/db/sql/admit_calls.sql``: the common case sent as typed arrays to
   ``gateway_admit_common_calls``, which falls back to deciding call by call in the same
   statement; anything the gateway can see is not common sent as JSON to
   ``gateway_admit_calls``).
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

    _OUTPUTS = "o_batch, o_tool_call_id, o_decision, o_outcome, o_content, o_approval_id, o_approval_status"
    ADMIT = f"SELECT {_OUTPUTS} FROM gateway_admit_calls($1::jsonb, $2::jsonb)"
    ADMIT_COMMON = (
        f"SELECT {_OUTPUTS} FROM gateway_admit_common_calls($1::integer[], $2::text[], $3::text[], $4::text[], "
        "$5::text[], $6::text[], $7::timestamptz[], $8::jsonb[], $9::jsonb[], $10::boolean, $11::text[], $12::text[], "
        "$13::text[], $14::text, $15::jsonb, NULL::jsonb)"
    )
    sends_common_case_as_arrays = True
    """The common case goes as typed arrays (``gateway_admit_common_calls``), everything else
    as JSON; False sends everything as JSON (``gateway_admit_calls`` then finds the common case)."""
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
        # Runs are locked in the order given: sorting by run id keeps every statement's order the
        # same (the tenant breaks ties: a run's key is its tenant and id, and ids are unique per tenant).
        order = sorted(range(len(items)), key=lambda i: (items[i].run_id, items[i].principal.tenant_id))
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
        as_json = self._encoder.encode(batches).decode()
        arrays = _common_case_arrays(batches, [items[i] for i in order]) if self.sends_common_case_as_arrays else None
        if arrays is None:
            rows = await conn.fetch(self.ADMIT, as_json, self._contents)
        else:  # the JSON goes along as text, parsed only if the database finds the case not common after all
            rows = await conn.fetch(self.ADMIT_COMMON, *arrays, as_json, self._contents)
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


_PLAIN_CALL_KEYS = frozenset({"audit", "call_hash", "needs_approval", "approval_id", "arguments", "read_only", "result"})
"""What a plain call's admission payload may hold: a key an admission guard adds beyond these
(``guards.admission_payload``) sends the statement as JSON, to the SQL that knows it."""


def _common_case_arrays(batches: list[dict[str, Any]], items: list[_AdmitItem]) -> list[Any] | None:
    """The arguments of ``gateway_admit_common_calls`` up to its runs' owners, from the
    statement's batches (and their items, in the same order), or ``None`` when the batches are
    not plainly the common case, as ``gateway_admit_calls`` would find from the same JSON
    (``admit_calls.sql``; a time without a zone, or a batch naming no owner, goes as JSON too).
    The database counts each run's calls and latest time from the calls themselves."""
    batch_of: list[int] = []
    run_of: list[str] = []
    ids: list[str] = []
    tools: list[str | None] = []
    hashes_of_arguments: list[str | None] = []
    call_hashes: list[str] = []
    times: list[datetime] = []
    results: list[str | None] = []
    audits: list[str] = []
    read_only = True
    owners: dict[str, tuple[str, str]] = {}  # run id -> (tenant, user), in the order of first batch
    seen: set[tuple[str, str]] = set()
    encode = _encode_json
    for index, (batch, item) in enumerate(zip(batches, items, strict=True)):
        calls = batch["calls"]
        owner = (item.principal.tenant_id, item.principal.user_id)
        if not calls or item.now.tzinfo is None or item.run_id is None or None in owner:
            return None
        if owners.setdefault(item.run_id, owner) != owner:
            return None
        for call in calls:
            if (not call.keys() <= _PLAIN_CALL_KEYS or call.get("needs_approval") not in (None, False)
                    or call.get("call_hash") is None):
                return None
            part = call["audit"]
            key = (item.run_id, part.get("tool_call_id"))
            if key[1] is None or key in seen:
                return None
            seen.add(key)
            batch_of.append(index)
            run_of.append(item.run_id)
            ids.append(key[1])
            tools.append(part.get("tool"))
            hashes_of_arguments.append(part.get("arguments_sha256"))
            call_hashes.append(call["call_hash"])
            times.append(item.now)
            result = call.get("result")
            results.append(None if result is None else encode(result).decode())
            audits.append(encode({**batch["audit"], **part}).decode())
            read_only = read_only and call.get("read_only") is True
    return [
        batch_of, run_of, ids, tools, hashes_of_arguments, call_hashes, times, results, audits, read_only,
        list(owners), [tenant for tenant, _ in owners.values()], [user for _, user in owners.values()],
    ]


_encode_json = msgspec.json.Encoder().encode


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
