"""The admission statement's two ways of deciding (``gateway/db/sql/admit_calls.sql``): the
common case set-based, everything else call by call. Each scenario runs three times on runs
made alike, in the same statements: as the ledger sends them (the common case as typed arrays
to ``gateway_admit_common_calls``, anything else as JSON), all as JSON through
``gateway_admit_calls``, and through the loop alone (``gateway_admit_calls_one_by_one``); the
answers, the stored calls, counts, approvals and runs, and the audit rows (in their order) must
be the same, and the scenario takes the way it names. PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.db.models import Approval, AuditEvent, Run, RunCallCount, ToolCall
from gateway.db.runs import create_run
from gateway.execution import ledger as ledger_module
from gateway.execution.checks import CallPlan, plan_call
from gateway.execution.ledger import Admission, FinishedCall, PostgresLedger, _AdmitItem, create_ledger
from gateway.execution.protocol import ToolCallRequest
from gateway.execution.runner import OK, CallOutcome
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry

ALICE = Principal("acme", "alice", frozenset({"editor"}), frozenset({"calculator:use", "articles:write"}))
BOB = Principal("acme", "bob", frozenset(), frozenset({"calculator:use"}))
REGISTRY = ToolRegistry(builtin_tools())
APPROVAL_TTL = timedelta(hours=1)
STALE_AFTER = timedelta(minutes=20)
LOOP = "gateway_admit_calls_one_by_one"


class PathLedger(PostgresLedger):
    """The real ledger; each admission statement runs in a transaction of its own that tells
    whether it went call by call, and whether the gateway's arrays decided it.
    ``loop_only``: the statement calls the loop itself; ``arrays``: the ledger sends the
    common case as arrays (else everything as JSON)."""

    def __init__(self, *args: Any, loop_only: bool = False, arrays: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if loop_only:
            self.ADMIT = PostgresLedger.ADMIT.replace("gateway_admit_calls(", f"{LOOP}(")
        self.sends_common_case_as_arrays = arrays and not loop_only
        self.loop_only = loop_only
        self.went_call_by_call: list[bool] = []
        self.went_as_arrays: list[bool] = []
        self.went_as_json: list[bool] = []
        self.went_as_arrays_then_by_call: list[bool] = []

    async def _admit_many(self, conn: Any, items: Sequence[_AdmitItem]) -> list[list[Admission] | None]:
        # Counted before and after, in one transaction: a function's counts of an earlier
        # transaction on this connection may still show here until the server flushes them.
        counts = ("SELECT funcname, coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
                  " WHERE funcname = ANY($1::text[]) GROUP BY funcname")
        names = [LOOP, "gateway_admit_calls", "gateway_admit_common_calls"]
        async with conn.transaction():
            await conn.execute("SET LOCAL track_functions = 'pl'")
            before = dict(await conn.fetch(counts, names))
            grouped = await super()._admit_many(conn, items)
            after = dict(await conn.fetch(counts, names))
        called = {name: after.get(name, 0) > before.get(name, 0) for name in names}
        self.went_call_by_call.append(self.loop_only or called[LOOP])
        self.went_as_arrays.append(
            called["gateway_admit_common_calls"] and not called["gateway_admit_calls"] and not called[LOOP]
        )
        self.went_as_json.append(called["gateway_admit_calls"])
        self.went_as_arrays_then_by_call.append(
            called["gateway_admit_common_calls"] and called[LOOP] and not called["gateway_admit_calls"]
        )
        return grouped


@dataclass(frozen=True)
class Call:
    """One tool call of a request, as the model sends it."""

    id: str
    name: str = "add"
    arguments: str = '{"a": 1, "b": 2}'
    ran_ahead: bool = False
    """A pure call whose outcome comes with it."""
    tool_cap: int | None = None


@dataclass(frozen=True)
class Request:
    run: int
    """Index of the scenario's run."""
    calls: tuple[Call, ...]
    principal: Principal = ALICE
    at: timedelta = timedelta(0)
    """When the request is given, after the scenario's start."""


@dataclass(frozen=True)
class RunSpec:
    max_tool_calls: int = 100
    max_repeats: int = 2
    expires_after: timedelta | None = None


@dataclass
class Side:
    ledger: PathLedger
    runs: list[str] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)


START = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def plan_of(call: Call, principal: Principal) -> CallPlan:
    plan = plan_call(REGISTRY, principal, ToolCallRequest(id=call.id, name=call.name, arguments=call.arguments.encode()))
    if plan.needs_approval:
        plan.approval_id = "apr_" + uuid.uuid4().hex
    if call.tool_cap is not None:
        plan.tool_call_cap = call.tool_cap
    return plan


def item_of(request: Request, run_id: str) -> _AdmitItem:
    now = START + request.at
    plans = [plan_of(call, request.principal) for call in request.calls]
    ran_ahead = {
        plan.id: CallOutcome(outcome=OK, content=f'{{"ok":true,"result":"{plan.id}"}}', duration_ms=0.5)
        for plan, call in zip(plans, request.calls, strict=True)
        if call.ran_ahead
    }
    return _AdmitItem(request.principal, run_id, plans, "req_" + request.calls[0].id if request.calls else None,
                      now, now - STALE_AFTER, now + APPROVAL_TTL, ran_ahead or None)


async def play(db: Database, side: Side, specs: Sequence[RunSpec], statements: Sequence[Sequence[Request]]) -> None:
    # The ledger orders a statement's requests by run id: the runs of both sides sort alike.
    prefix = "run_" + uuid.uuid4().hex[:12]
    async with db.begin() as conn:
        for i, spec in enumerate(specs):
            side.runs.append(f"{prefix}_{i:02d}")
            expires_at = START + spec.expires_after if spec.expires_after is not None else None
            await conn.execute(sa.insert(Run).values(
                id=side.runs[-1], tenant_id="acme", user_id="alice", max_tool_calls=spec.max_tool_calls,
                max_repeats=spec.max_repeats, used_tool_calls=0, expires_at=expires_at, created_at=START,
            ))
    async with db.driver() as conn:
        for requests in statements:
            items = [item_of(request, side.runs[request.run]) for request in requests]
            grouped = await side.ledger._admit_many(conn, items)
            side.answers.append([
                None if admissions is None else [
                    (a.tool_call_id, a.decision, a.outcome, a.content, a.approval_id is not None, a.approval_status)
                    for a in admissions
                ]
                for admissions in grouped
            ])


async def stored(db: Database, runs: list[str]) -> dict[str, Any]:
    """What the runs' statements left, with run ids as their index and approval ids as present or not."""
    index = {run_id: i for i, run_id in enumerate(runs)}
    calls, counts, approvals, audit = ToolCall.__table__, RunCallCount.__table__, Approval.__table__, AuditEvent.__table__
    async with db.connect() as conn:
        used = (await conn.execute(sa.select(Run.id, Run.used_tool_calls).where(Run.id.in_(runs)))).all()
        call_rows = (await conn.execute(sa.select(calls).where(calls.c.run_id.in_(runs)))).mappings().all()
        count_rows = (await conn.execute(sa.select(counts).where(counts.c.run_id.in_(runs)))).mappings().all()
        approval_rows = (await conn.execute(sa.select(approvals).where(approvals.c.run_id.in_(runs)))).mappings().all()
        audit_rows = (
            await conn.execute(sa.select(audit).where(audit.c.run_id.in_(runs)).order_by(audit.c.id))
        ).mappings().all()

    def plain(row: Any, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
        values = {k: v for k, v in row.items() if k not in drop}
        if "run_id" in values:
            values["run_id"] = index[values["run_id"]]
        if "approval_id" in values:
            values["approval_id"] = values["approval_id"] is not None
        return values

    return {
        "used": sorted((index[run_id], n) for run_id, n in used),
        "calls": sorted((plain(r) for r in call_rows), key=lambda r: (r["run_id"], r["tool_call_id"])),
        "counts": sorted((plain(r) for r in count_rows), key=lambda r: (r["run_id"], r["call_hash"])),
        "approvals": sorted((plain(r, drop=("id",)) for r in approval_rows), key=lambda r: (r["run_id"], r["tool_call_id"])),
        "audit": [plain(r, drop=("id", "txid")) for r in audit_rows],
    }


async def both_ways(
    db: Database, specs: Sequence[RunSpec], statements: Sequence[Sequence[Request]]
) -> tuple[list[bool], list[Any]]:
    """Plays the statements through both functions; asserts they answer and store the same. Returns
    for each statement whether ``gateway_admit_calls`` went call by call, and its answers."""
    as_sent = PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER)
    as_json = PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER, arrays=False)
    loop = PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER, loop_only=True)
    sides = Side(as_sent), Side(as_json), Side(loop)
    try:
        for side in sides:
            await play(db, side, specs, statements)
    finally:
        for side in sides:
            await side.ledger.close()
    assert sides[0].answers == sides[1].answers == sides[2].answers
    assert await stored(db, sides[0].runs) == await stored(db, sides[1].runs) == await stored(db, sides[2].runs)
    # The same statements go the same way as arrays and as JSON; what is not call by call was
    # decided from the gateway's arrays, without gateway_admit_calls unpacking any JSON.
    assert as_sent.went_call_by_call == as_json.went_call_by_call
    assert as_sent.went_as_arrays == [not by_call for by_call in as_sent.went_call_by_call]
    # The ledger sends JSON only for what it can see is not the common case.
    assert all(by_call for by_call, json in zip(as_sent.went_call_by_call, as_sent.went_as_json, strict=True) if json)
    assert not any(as_json.went_as_arrays) and all(as_json.went_as_json)
    return as_sent.went_call_by_call, sides[0].answers


def calls(prefix: str, count: int, **kwargs: Any) -> tuple[Call, ...]:
    return tuple(Call(f"{prefix}{i}", arguments=f'{{"a": {i}, "b": 2}}', **kwargs) for i in range(count))


async def test_fresh_calls_of_several_requests_and_runs_are_decided_set_based_as_the_loop_decides(db):
    statements = [
        [Request(0, calls("a", 3, ran_ahead=True)), Request(0, calls("b", 2)), Request(1, calls("c", 1, ran_ahead=True)),
         Request(2, calls("d", 8), at=timedelta(seconds=1))],
        [Request(1, calls("e", 2)), Request(2, calls("f", 1, ran_ahead=True))],
    ]
    ways, answers = await both_ways(db, [RunSpec(), RunSpec(), RunSpec()], statements)
    assert ways == [False, False]
    assert [a[1] for a in answers[0][0]] == ["executed"] * 3


async def test_repeats_past_the_limit_within_and_across_statements_are_refused_set_based(db):
    same = Call("r0", arguments='{"a": 7, "b": 7}', ran_ahead=True)
    statements = [
        [Request(0, (same, Call("r1", arguments='{"b": 7, "a": 7}'), Call("r2", arguments='{"a": 7, "b": 7}'))),
         Request(0, (Call("r3", arguments='{"a": 7, "b": 7}', ran_ahead=True), Call("r4", arguments='{"a": 8, "b": 8}')))],
        [Request(0, (Call("r5", arguments='{"a": 7, "b": 7}'), Call("r6", arguments='{"a": 9, "b": 9}')))],
    ]
    ways, answers = await both_ways(db, [RunSpec(max_repeats=2)], statements)
    assert ways == [False, False]
    outcomes = [row[2] for request in answers[0] for row in request]
    assert outcomes.count("REPEATED_CALL") == 2


async def test_a_budget_filled_exactly_is_set_based_and_one_call_past_it_goes_call_by_call(db):
    statements = [
        [Request(0, calls("x", 3, ran_ahead=True)), Request(0, calls("y", 2))],
        [Request(0, calls("z", 1))],
    ]
    ways, answers = await both_ways(db, [RunSpec(max_tool_calls=5)], statements)
    assert ways == [False, True]
    assert answers[1][0][0][1:3] == ("decided", "BUDGET_EXCEEDED")


async def test_a_replayed_id_among_fresh_calls_goes_call_by_call(db):
    statements = [
        [Request(0, calls("p", 2, ran_ahead=True)), Request(1, calls("q", 1))],
        [Request(0, (Call("new0", arguments='{"a": 50, "b": 1}'), Call("p0", arguments='{"a": 0, "b": 2}', ran_ahead=True))),
         Request(1, (Call("q0", arguments='{"a": 0, "b": 2}'),), at=timedelta(minutes=30)),
         Request(1, calls("fresh", 2))],
    ]
    ways, answers = await both_ways(db, [RunSpec(), RunSpec()], statements)
    assert ways == [False, True]
    assert [row[1] for row in answers[1][0]] == ["execute", "replay"]
    assert answers[1][1][0][1:3] == ("replay", "TOOL_OUTCOME_UNKNOWN")


async def test_an_id_naming_another_call_goes_call_by_call(db):
    statements = [
        [Request(0, calls("k", 2))],
        [Request(0, (Call("k1", arguments='{"a": 99, "b": 2}'), Call("k9", arguments='{"a": 9, "b": 9}')))],
    ]
    ways, answers = await both_ways(db, [RunSpec()], statements)
    assert ways == [False, True]
    assert answers[1][0][0][1:3] == ("decided", "TOOL_CALL_ID_CONFLICT")


async def test_a_call_refused_by_its_checks_goes_call_by_call(db):
    statements = [[Request(0, (Call("bad", arguments='{"a": "1", "b": 2}'), *calls("ok", 2, ran_ahead=True))),
                   Request(1, calls("other", 1))]]
    ways, answers = await both_ways(db, [RunSpec(), RunSpec()], statements)
    assert ways == [True]
    assert answers[0][0][0][1:3] == ("decided", "INVALID_ARGUMENTS")


async def test_a_call_needing_approval_goes_call_by_call(db):
    write = Call("w", name="create_article", arguments='{"title": "T", "body": "B"}')
    statements = [[Request(0, (write, *calls("n", 2))), Request(1, calls("m", 1, ran_ahead=True))],
                  [Request(0, (write,))]]
    ways, answers = await both_ways(db, [RunSpec(), RunSpec()], statements)
    assert ways == [True, True]
    assert answers[0][0][0][1:3] == ("decided", "APPROVAL_REQUIRED")
    assert answers[1][0][0][1:3] == ("replay", "APPROVAL_REQUIRED")


async def test_a_tool_cap_goes_call_by_call(db):
    statements = [[Request(0, calls("t", 3, tool_cap=2)), Request(1, calls("u", 1))]]
    ways, answers = await both_ways(db, [RunSpec(), RunSpec()], statements)
    assert ways == [True]
    assert [row[2] for row in answers[0][0]] == [None, None, "BUDGET_EXCEEDED"]


async def test_an_expired_run_goes_call_by_call(db):
    statements = [
        [Request(0, calls("e", 1), at=timedelta(minutes=59)), Request(1, calls("f", 1))],
        [Request(0, calls("g", 1), at=timedelta(minutes=61)), Request(1, calls("h", 1))],
    ]
    ways, answers = await both_ways(db, [RunSpec(expires_after=timedelta(hours=1)), RunSpec()], statements)
    assert ways == [False, True]
    assert answers[1][0][0][1:3] == ("decided", "RUN_EXPIRED")


async def test_a_run_expiring_between_two_requests_of_a_statement_goes_call_by_call(db):
    statements = [[Request(0, calls("before", 1), at=timedelta(minutes=59)),
                   Request(0, calls("after", 1), at=timedelta(minutes=61))]]
    ways, answers = await both_ways(db, [RunSpec(expires_after=timedelta(hours=1))], statements)
    assert ways == [True]
    assert [request[0][1:3] for request in answers[0]] == [("execute", None), ("decided", "RUN_EXPIRED")]


async def test_a_run_of_another_user_goes_call_by_call(db):
    statements = [[Request(0, calls("mine", 2)), Request(0, calls("theirs", 1), principal=BOB)]]
    ways, answers = await both_ways(db, [RunSpec()], statements)
    assert ways == [True]
    assert answers[0][1] is None and [row[1] for row in answers[0][0]] == ["execute", "execute"]


async def test_one_id_in_two_requests_of_a_statement_goes_call_by_call(db):
    statements = [[Request(0, calls("s", 1, ran_ahead=True)), Request(0, calls("s", 1))]]
    ways, answers = await both_ways(db, [RunSpec()], statements)
    assert ways == [True]
    assert (answers[0][0][0][1], answers[0][1][0][1]) == ("executed", "replay")


@pytest.mark.parametrize("arrays", [True, False], ids=["sent-as-arrays", "sent-as-json"])
async def test_read_only_claims_decided_set_based_commit_without_waiting_for_their_flush(db, arrays):
    reader = Principal("acme", "alice", ALICE.roles, ALICE.permissions | {"articles:read"})
    search = Call("s", name="search_articles", arguments='{"query": "x"}')
    ledger = PathLedger(db, approval_ttl=APPROVAL_TTL, arrays=arrays)
    side = Side(ledger)
    modes: list[str] = []

    async def admit_many(conn: Any, items: Sequence[_AdmitItem]) -> list[list[Admission] | None]:
        async with conn.transaction():
            grouped = await PathLedger._admit_many(ledger, conn, items)
            modes.append(await conn.fetchval("SELECT current_setting('synchronous_commit')"))
        return grouped

    ledger._admit_many = admit_many  # type: ignore[method-assign]
    try:
        await play(db, side, [RunSpec(), RunSpec()], [[Request(0, (search,), principal=reader),
                                                       Request(1, (Call("s2", name="search_articles",
                                                                        arguments='{"query": "y"}'),),
                                                               principal=reader)],
                                                      [Request(0, (Call("s3", name="search_articles",
                                                                        arguments='{"query": "z"}'),
                                                                   Call("plain", ran_ahead=True)), principal=reader)]])
    finally:
        await ledger.close()
    assert ledger.went_call_by_call == [False, False]
    assert ledger.went_as_arrays == [arrays, arrays]
    assert modes == ["off", "on"]


async def test_concurrent_requests_on_one_run_keep_its_budget_ids_and_repeats(db):
    async with db.begin() as conn:
        run_id = (await create_run(conn, tenant_id="acme", user_id="alice", max_tool_calls=40, max_repeats=3,
                                   expires_at=None, now=datetime.now(UTC))).id
    ledger = create_ledger(db, approval_ttl=APPROVAL_TTL, lanes=2, max_requests=8)
    try:
        requests = [[plan_of(Call(f"c{i}-{j}", arguments=f'{{"a": {i % 5}, "b": {j}}}'), ALICE) for j in range(2)]
                    for i in range(30)]
        requests += [[plan_of(Call("c0-0", arguments='{"a": 0, "b": 0}'), ALICE)] for _ in range(4)]
        results = await asyncio.gather(*(
            ledger.admit(ALICE, run_id, plans, request_id="req", now=datetime.now(UTC),
                         ran_ahead={plans[0].id: CallOutcome(OK, '{"ok":true}', 0.1)} if i % 2 else None)
            for i, plans in enumerate(requests)
        ))
    finally:
        await ledger.close()
    decisions = [a for admissions in results for a in admissions]
    admitted = [a for a in decisions if a.decision in ("execute", "executed")]
    repeated = [a for a in decisions if (a.decision, a.outcome) == ("decided", "REPEATED_CALL")]
    budget = [a for a in decisions if (a.decision, a.outcome) == ("decided", "BUDGET_EXCEEDED")]
    replays = [a for a in decisions if a.decision == "replay"]
    assert len({a.tool_call_id for a in admitted}) == len(admitted)
    assert len(admitted) + len(repeated) + len(budget) + len(replays) == len(decisions)
    assert len(admitted) + len(repeated) == 40 and len(replays) == 4
    async with db.connect() as conn:
        used = await conn.scalar(sa.select(Run.used_tool_calls).where(Run.id == run_id))
        counted = await conn.scalar(sa.select(sa.func.sum(RunCallCount.count)).where(RunCallCount.run_id == run_id))
        stored = await conn.scalar(sa.select(sa.func.count()).select_from(ToolCall).where(ToolCall.run_id == run_id))
        audited = await conn.scalar(sa.select(sa.func.count()).select_from(AuditEvent).where(
            AuditEvent.run_id == run_id, AuditEvent.kind == "tool_call"))
    assert used == counted == 40
    assert stored == 60
    executed = sum(1 for a in decisions if a.decision == "executed")
    assert audited == executed + len(repeated) + len(budget)


SCANNED = (
    "SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables "
    "WHERE relname IN ('runs', 'tool_calls', 'run_call_counts', 'approvals')"
)


class ScanCountingLedger(PostgresLedger):
    """The real ledger; each statement runs in a transaction of its own that counts the
    sequential scans of the tables the functions read by key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scans: list[int] = []

    async def _counted(self, conn: Any, statement: Any) -> Any:
        async with conn.transaction():
            before = await conn.fetchval(SCANNED)
            result = await statement()
            self.scans.append(await conn.fetchval(SCANNED) - before)
        return result

    async def _admit_many(self, conn: Any, items: Sequence[_AdmitItem]) -> list[list[Admission] | None]:
        return await self._counted(conn, lambda: super(ScanCountingLedger, self)._admit_many(conn, items))

    async def _record_many(self, conn: Any, items: Any) -> list[None]:
        return await self._counted(conn, lambda: super(ScanCountingLedger, self)._record_many(conn, items))


async def test_every_statement_reads_runs_and_calls_by_key_even_when_planned_while_the_tables_were_small(db):
    # A session plans the functions' statements once and keeps the plans (generic ones, in
    # gateway_admit_calls). A plan made while a table was nearly empty, as on a new install,
    # may scan it, and would go on scanning it on that connection as the table grows.
    ledger = ScanCountingLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER)
    side = Side(ledger)
    write = Call("w", name="create_article", arguments='{"title": "T", "body": "B"}')
    try:
        await play(db, side, [RunSpec(), RunSpec()], [
            [Request(0, calls("a", 3, ran_ahead=True)), Request(1, calls("b", 2))],  # set-based
            [Request(0, (write, *calls("c", 1))), Request(1, calls("b", 1))],  # call by call: approval, replay
        ])
        plans = [plan_of(call, ALICE) for call in calls("b", 2)]
        finished = [FinishedCall(plan, OK, '{"ok":true}', 0.5) for plan in plans]
        await ledger.record(ALICE, side.runs[1], finished, request_id="req_rec", now=START)
    finally:
        await ledger.close()
    assert len(ledger.scans) == 3
    assert ledger.scans == [0, 0, 0]


RUNS_FETCHED = "SELECT coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables WHERE relname = 'runs'"


@pytest.mark.parametrize("loop_only", [False, True], ids=["set-based", "call-by-call"])
async def test_a_run_is_found_by_its_key_however_many_older_runs_its_user_has(db, loop_only):
    # Plans made while runs held a few rows, not yet analyzed (a new install), could find a run
    # through (tenant_id, user_id, created_at): every older run of its user read first, at each
    # lookup, on that connection for good.
    ledger = PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER, loop_only=loop_only)
    prefix = "run_" + uuid.uuid4().hex[:12]
    runs = [f"{prefix}_{i}" for i in range(8)]

    def new_runs(ids: Sequence[str], created_at: datetime) -> list[dict[str, Any]]:
        return [dict(id=run_id, tenant_id="acme", user_id="alice", max_tool_calls=100, max_repeats=2,
                     used_tool_calls=0, created_at=created_at) for run_id in ids]

    def statement(label: str) -> list[_AdmitItem]:
        return [item_of(Request(i, (Call(f"{label}{i}"),)), run_id) for i, run_id in enumerate(runs)]

    try:
        async with db.begin() as conn:
            await conn.execute(sa.insert(Run), new_runs(runs, START))
        async with db.driver() as conn:
            await ledger._admit_many(conn, statement("first"))  # the plans are made now
            async with db.begin() as other:
                older = [f"{prefix}_old_{i}" for i in range(1000)]
                await other.execute(sa.insert(Run), new_runs(older, START - timedelta(days=30)))
            async with conn.transaction():
                before = await conn.fetchval(RUNS_FETCHED)
                grouped = await ledger._admit_many(conn, statement("second"))
                fetched = await conn.fetchval(RUNS_FETCHED) - before
    finally:
        await ledger.close()
    assert ledger.went_call_by_call == [loop_only, loop_only]
    assert [[a.decision for a in admissions or []] for admissions in grouped] == [["execute"]] * len(runs)
    # Each run read by key, once to lock it and once to add its calls to used_tool_calls.
    assert len(runs) <= fetched <= 2 * len(runs)


async def test_what_only_the_database_finds_not_common_goes_call_by_call_in_the_same_statement(db):
    # A replay and a budget reached: the gateway cannot see either, so it sends the arrays, and
    # the statement that finds them not common decides its calls one by one itself.
    ledger = PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER)
    side = Side(ledger)
    try:
        await play(db, side, [RunSpec(), RunSpec(max_tool_calls=2)],
                   [[Request(0, calls("r", 2))], [Request(0, calls("r", 1))], [Request(1, calls("b", 3))]])
    finally:
        await ledger.close()
    assert ledger.went_as_arrays == [True, False, False]
    assert ledger.went_as_arrays_then_by_call == [False, True, True]
    assert not any(ledger.went_as_json)
    assert side.answers[1][0][0][1] == "replay"
    assert [answer[1] for answer in side.answers[2][0]] == ["execute", "execute", "decided"]


def _run_listed_twice(arrays: list[Any]) -> list[Any]:
    arrays[10] = [arrays[10][0], arrays[10][0]]  # the second run's call is then of no run listed once
    return arrays


def _a_call_of_no_listed_run(arrays: list[Any]) -> list[Any]:
    arrays[10], arrays[11], arrays[12] = arrays[10][:1], arrays[11][:1], arrays[12][:1]
    return arrays


def _a_run_whose_calls_have_no_time(arrays: list[Any]) -> list[Any]:
    arrays[6] = arrays[6][:2] + [None]  # the second run's one call
    return arrays


def _an_owner_not_the_runs(arrays: list[Any]) -> list[Any]:
    arrays[11] = ["globex", *arrays[11][1:]]
    return arrays


def _an_audit_part_naming_someone_else(arrays: list[Any]) -> list[Any]:
    part = msgspec.json.decode(arrays[8][0])
    part.update(tenant_id="globex", user_id="mallory", run_id="run_elsewhere", tool_call_id="other")
    arrays[8] = [msgspec.json.encode(part).decode(), *arrays[8][1:]]
    return arrays


@pytest.mark.parametrize("tamper,falls_back", [
    (_run_listed_twice, True),
    (_a_call_of_no_listed_run, True),
    (_a_run_whose_calls_have_no_time, True),
    (_an_owner_not_the_runs, True),
    (_an_audit_part_naming_someone_else, False),
], ids=["a-run-listed-twice", "a-call-of-no-listed-run", "a-run-without-a-time", "an-owner-not-the-runs",
        "an-audit-part-naming-someone-else"])
async def test_arrays_that_disagree_with_their_runs_change_no_outcome(db, monkeypatch, tamper, falls_back):
    """The arrays come from the gateway; the database checks them against the runs it locks, so
    arrays that disagree (a bug) are decided call by call from the JSON, and an audit row names
    the run, owner and call as checked: the same answers and rows as the loop's."""
    statements = [[Request(0, calls("t", 2, ran_ahead=True)), Request(1, calls("u", 1, ran_ahead=True))]]
    loop = Side(PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER, loop_only=True))
    sent = Side(PathLedger(db, approval_ttl=APPROVAL_TTL, stale_after=STALE_AFTER))
    honest = ledger_module._common_case_arrays
    try:
        await play(db, loop, [RunSpec(), RunSpec()], statements)
        monkeypatch.setattr(ledger_module, "_common_case_arrays",
                            lambda batches, items: tamper(honest(batches, items)))
        await play(db, sent, [RunSpec(), RunSpec()], statements)
    finally:
        for side in (loop, sent):
            await side.ledger.close()
    assert sent.ledger.went_as_arrays_then_by_call == [falls_back]
    assert sent.ledger.went_as_arrays == [not falls_back]
    assert sent.answers == loop.answers
    assert await stored(db, sent.runs) == await stored(db, loop.runs)
