"""The ledger's atomic decisions: budget, tool caps, repeats, replays,
approvals and audit rows — also when many requests share one PostgreSQL statement."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.db.models import Approval, AuditEvent, Run, ToolCall
from gateway.db.runs import create_run
from gateway.execution.checks import plan_call
from gateway.execution.executor import ToolExecutor
from gateway.execution.ledger import FinishedCall, Ledger, PostgresLedger, RunNotFound, create_ledger
from gateway.execution.protocol import ToolCallRequest
from gateway.execution.runner import OK, CallOutcome
from gateway.observability.metrics import Metrics
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry
from tests.support.app import make_settings

ALICE = Principal("acme", "alice", frozenset({"editor"}), frozenset({"calculator:use", "articles:write"}))
REGISTRY = ToolRegistry(builtin_tools())


@pytest.fixture
async def ledger(db: Database):
    led = create_ledger(db, approval_ttl=timedelta(hours=1))
    yield led
    await led.close()


async def new_run(db: Database, *, max_tool_calls: int = 100, max_repeats: int = 2, expires_at=None) -> str:
    async with db.begin() as conn:
        row = await create_run(conn, tenant_id="acme", user_id="alice", max_tool_calls=max_tool_calls,
                               max_repeats=max_repeats, expires_at=expires_at, now=datetime.now(UTC))
    return row.id


def call(name: str = "add", arguments: str = '{"a": 1, "b": 2}', call_id: str | None = None):
    plan = plan_call(REGISTRY, ALICE, ToolCallRequest(id=call_id or uuid.uuid4().hex, name=name,
                                                       arguments=arguments.encode()))
    if plan.needs_approval:
        plan.approval_id = "apr_" + uuid.uuid4().hex
    return plan


async def admit(ledger: Ledger, run_id: str, plans, *, now: datetime | None = None):
    return await ledger.admit(ALICE, run_id, plans, request_id="req_test", now=now or datetime.now(UTC))


async def count(db: Database, table, **where) -> int:
    async with db.connect() as conn:
        stmt = sa.select(sa.func.count()).select_from(table)
        for column, value in where.items():
            stmt = stmt.where(getattr(table.c, column) == value)
        return int(await conn.scalar(stmt))


async def test_budget_is_given_to_calls_in_order_and_the_rest_is_refused(db, ledger):
    run_id = await new_run(db, max_tool_calls=3)
    plans = [call(arguments=f'{{"a": {i}, "b": 0}}') for i in range(5)]
    admissions = await admit(ledger, run_id, plans)
    assert [a.decision for a in admissions] == ["execute"] * 3 + ["decided"] * 2
    assert [a.outcome for a in admissions[3:]] == ["BUDGET_EXCEEDED"] * 2
    async with db.connect() as conn:
        used = await conn.scalar(sa.select(Run.used_tool_calls).where(Run.id == run_id))
    assert used == 3


async def test_rejected_calls_are_stored_and_audited_but_cost_no_budget(db, ledger):
    run_id = await new_run(db, max_tool_calls=1)
    bad = call(arguments='{"a": "1", "b": 2}')
    assert bad.rejected is not None
    admissions = await admit(ledger, run_id, [bad, call()])
    assert admissions[0].outcome == "INVALID_ARGUMENTS" and admissions[1].decision == "execute"
    assert await count(db, AuditEvent.__table__, run_id=run_id, outcome="INVALID_ARGUMENTS") == 1


async def test_the_repeat_limit_refuses_the_call_after_max_repeats_identical_ones(db, ledger):
    run_id = await new_run(db, max_repeats=2)
    outcomes = []
    for arguments in ('{"a": 1, "b": 2}', '{"b": 2, "a": 1}', '{"a": 1, "b": 2}'):
        outcomes.append((await admit(ledger, run_id, [call(arguments=arguments)]))[0].outcome)
    assert outcomes == [None, None, "REPEATED_CALL"]


async def test_a_tool_cap_refuses_calls_of_that_tool_past_it(db, ledger):
    run_id = await new_run(db)
    plans = [call(arguments=f'{{"a": {i}, "b": 0}}') for i in range(3)]
    for plan in plans:
        plan.tool_call_cap = 2
    admissions = await admit(ledger, run_id, plans)
    assert [a.outcome for a in admissions] == [None, None, "BUDGET_EXCEEDED"]
    assert "call limit" in (admissions[2].content or "")
    other = await admit(ledger, run_id, [call("multiply")])
    assert other[0].decision == "execute"


async def test_a_known_tool_call_id_is_replayed_and_costs_nothing(db, ledger):
    run_id = await new_run(db, max_tool_calls=1)
    first = call(call_id="call_1")
    [admission] = await admit(ledger, run_id, [first])
    await ledger.record(ALICE, run_id, [FinishedCall(first, "OK", '{"ok":true,"result":3}', 0.1)],
                        request_id="req_test", now=datetime.now(UTC))
    [replay] = await admit(ledger, run_id, [call(call_id="call_1")])
    assert replay.decision == "replay" and replay.content == '{"ok":true,"result":3}'
    assert await count(db, ToolCall.__table__, run_id=run_id) == 1


async def test_a_call_that_changes_data_creates_one_approval_and_replays_its_state(db, ledger):
    run_id = await new_run(db)
    plan = call("create_article", '{"title": "T", "body": "B"}', call_id="call_w")
    [admission] = await admit(ledger, run_id, [plan])
    assert admission.outcome == "APPROVAL_REQUIRED" and admission.approval_id == plan.approval_id
    [again] = await admit(ledger, run_id, [call("create_article", '{"title": "T", "body": "B"}', call_id="call_w")])
    assert again.decision == "replay" and again.approval_id == plan.approval_id
    assert again.outcome == "APPROVAL_REQUIRED"
    assert await count(db, Approval.__table__, run_id=run_id) == 1


async def test_a_run_is_expired_at_the_time_the_ledger_is_given(db, ledger):
    expires_at = datetime.now(UTC) + timedelta(hours=1)
    run_id = await new_run(db, expires_at=expires_at)
    [before] = await admit(ledger, run_id, [call(arguments='{"a": 1, "b": 1}')], now=expires_at - timedelta(seconds=1))
    [after] = await admit(ledger, run_id, [call(arguments='{"a": 2, "b": 2}')], now=expires_at + timedelta(seconds=1))
    assert before.decision == "execute"
    assert (after.decision, after.outcome) == ("decided", "RUN_EXPIRED")


async def test_an_approval_past_its_ttl_at_the_given_time_is_expired(db, ledger):
    run_id = await new_run(db)
    now = datetime.now(UTC)
    plan = call("create_article", '{"title": "T", "body": "B"}', call_id="call_w")
    [asked] = await admit(ledger, run_id, [plan], now=now)
    again = call("create_article", '{"title": "T", "body": "B"}', call_id="call_w")
    [within] = await admit(ledger, run_id, [again], now=now + timedelta(minutes=59))
    [past] = await admit(ledger, run_id, [again], now=now + timedelta(hours=1, seconds=1))
    assert asked.outcome == within.outcome == "APPROVAL_REQUIRED"
    assert (past.decision, past.outcome, past.approval_status) == ("replay", "APPROVAL_EXPIRED", "pending")


async def test_a_call_is_stale_once_the_given_time_passes_its_start_by_stale_after(db, ledger):
    run_id = await new_run(db)
    now = datetime.now(UTC)
    [first] = await admit(ledger, run_id, [call(call_id="interrupted")], now=now)
    [soon] = await admit(ledger, run_id, [call(call_id="interrupted")], now=now + timedelta(minutes=19))
    [late] = await admit(ledger, run_id, [call(call_id="interrupted")], now=now + timedelta(minutes=21))
    assert first.decision == "execute"  # the ledger's stale_after is 20 minutes by default
    assert soon.outcome == "TOOL_CALL_IN_PROGRESS"
    assert late.outcome == "TOOL_OUTCOME_UNKNOWN"


async def test_the_audit_rows_of_admission_and_record_carry_the_given_time(db, ledger):
    run_id = await new_run(db)
    admitted_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    recorded_at = admitted_at + timedelta(seconds=7)
    plan, refused = call(call_id="runs"), call("no_such_tool", call_id="refused")
    await admit(ledger, run_id, [plan, refused], now=admitted_at)
    await ledger.record(ALICE, run_id, [FinishedCall(plan, "OK", '{"ok":true,"result":3}', 0.1)],
                        request_id="req_test", now=recorded_at)
    async with db.connect() as conn:
        rows = (await conn.execute(sa.select(AuditEvent.__table__).where(AuditEvent.run_id == run_id))).all()
        stored = (await conn.execute(sa.select(ToolCall.__table__).where(ToolCall.run_id == run_id, ToolCall.tool_call_id == "runs"))).one()
    times = {(row.tool_call_id, row.outcome): row.created_at for row in rows}
    assert times == {("refused", "TOOL_NOT_FOUND"): admitted_at, ("runs", "OK"): recorded_at}
    assert (stored.created_at, stored.finished_at) == (admitted_at, recorded_at)


async def test_another_users_run_is_not_found(db, ledger):
    run_id = await new_run(db)
    bob = Principal("acme", "bob", frozenset(), frozenset({"calculator:use"}))
    with pytest.raises(RunNotFound):
        await ledger.admit(bob, run_id, [call()], request_id=None, now=datetime.now(UTC))


async def test_concurrent_requests_on_many_runs_share_statements_and_each_budget_holds(db, ledger):
    runs = [await new_run(db, max_tool_calls=5) for _ in range(4)]
    requests = [(run_id, [call(arguments=f'{{"a": {i}, "b": {j}}}')]) for run_id in runs for i in range(3)
                for j in range(3)]
    results = await asyncio.gather(*(admit(ledger, run_id, plans) for run_id, plans in requests))
    for run_id in runs:
        executed = sum(1 for (r, _), adm in zip(requests, results, strict=True) if r == run_id
                       and adm[0].decision == "execute")
        assert executed == 5


async def test_one_tool_call_id_sent_twice_at_once_is_executed_once(db, ledger):
    run_id = await new_run(db)
    results = await asyncio.gather(*(admit(ledger, run_id, [call(call_id="same")]) for _ in range(6)))
    decisions = sorted(r[0].decision for r in results)
    assert decisions.count("execute") == 1
    assert await count(db, ToolCall.__table__, run_id=run_id) == 1


async def test_a_call_left_executing_is_in_progress_then_its_outcome_is_unknown(db, ledger):
    run_id = await new_run(db)
    [first] = await admit(ledger, run_id, [call(call_id="interrupted")])
    assert first.decision == "execute"  # ... and its process stops before recording it
    [soon] = await admit(ledger, run_id, [call(call_id="interrupted")])
    assert (soon.decision, soon.outcome) == ("replay", "TOOL_CALL_IN_PROGRESS")
    later = create_ledger(db, approval_ttl=timedelta(hours=1), stale_after=timedelta(0))
    try:
        [late] = await admit(later, run_id, [call(call_id="interrupted")])
    finally:
        await later.close()
    assert (late.decision, late.outcome) == ("replay", "TOOL_OUTCOME_UNKNOWN")


def computed(outcome: str = OK, content: str = '{"ok":true,"result":3}') -> CallOutcome:
    return CallOutcome(outcome=outcome, content=content, duration_ms=0.25)


async def test_a_pure_call_admitted_with_its_outcome_is_stored_and_audited_in_the_admission(db, ledger):
    run_id = await new_run(db)
    plan = call()
    [admission] = await ledger.admit(ALICE, run_id, [plan], request_id="req_test", now=datetime.now(UTC),
                                     ran_ahead={plan.id: computed()})
    assert admission.decision == "executed" and admission.outcome == OK
    async with db.connect() as conn:
        stored = (await conn.execute(sa.select(ToolCall).where(ToolCall.run_id == run_id))).one()
        audited = (await conn.execute(sa.select(AuditEvent).where(AuditEvent.run_id == run_id))).one()
    assert (stored.status, stored.outcome, stored.content) == ("done", OK, '{"ok":true,"result":3}')
    assert (audited.kind, audited.outcome, audited.tool_call_id, audited.duration_ms) == ("tool_call", OK, plan.id, 0.25)
    [replayed] = await admit(ledger, run_id, [call(call_id=plan.id)])
    assert (replayed.decision, replayed.content) == ("replay", '{"ok":true,"result":3}')


async def test_a_pure_call_refused_at_admission_stores_the_refusal_not_what_it_computed(db, ledger):
    run_id = await new_run(db, max_tool_calls=1, max_repeats=5)
    first, second = call(), call()
    admissions = await ledger.admit(ALICE, run_id, [first, second], request_id="req_test", now=datetime.now(UTC),
                                    ran_ahead={first.id: computed(), second.id: computed()})
    assert [a.decision for a in admissions] == ["executed", "decided"]
    assert admissions[1].outcome == "BUDGET_EXCEEDED"
    async with db.connect() as conn:
        stored = (await conn.execute(sa.select(ToolCall).where(ToolCall.tool_call_id == second.id))).one()
        outcomes = sorted((await conn.scalars(sa.select(AuditEvent.outcome).where(AuditEvent.run_id == run_id))).all())
    assert (stored.outcome, "result" in (stored.content or "")) == ("BUDGET_EXCEEDED", False)
    assert outcomes == sorted(["BUDGET_EXCEEDED", OK])


async def test_an_outcome_given_for_a_call_the_run_already_knows_is_dropped_for_the_stored_one(db, ledger):
    run_id = await new_run(db)
    plan = call()
    await ledger.admit(ALICE, run_id, [plan], request_id="req_test", now=datetime.now(UTC),
                       ran_ahead={plan.id: computed()})
    again = call(call_id=plan.id)
    [admission] = await ledger.admit(ALICE, run_id, [again], request_id="req_test", now=datetime.now(UTC),
                                     ran_ahead={again.id: computed(content='{"ok":true,"result":99}')})
    assert (admission.decision, admission.content) == ("replay", '{"ok":true,"result":3}')


class CountingLedger(PostgresLedger):
    """The real ledger, counting its statements of each kind."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.admits = self.records = 0

    async def admit(self, *args, **kwargs):
        self.admits += 1
        return await super().admit(*args, **kwargs)

    async def record(self, *args, **kwargs):
        self.records += 1
        return await super().record(*args, **kwargs)


async def test_a_batch_of_pure_calls_costs_one_ledger_statement_and_other_tools_two(db, database_url):
    ledger = CountingLedger(db, approval_ttl=timedelta(hours=1))
    executor = ToolExecutor(settings=make_settings(database_url), db=db, registry=REGISTRY, ledger=ledger,
                            metrics=Metrics())
    try:
        run_id = await new_run(db)
        pure = [ToolCallRequest(id=f"c{i}", name="add", arguments=b'{"a": %d, "b": 3}' % i) for i in range(3)]
        messages = await executor.execute(ALICE, run_id, pure, request_id="req_test")
        assert [m.content for m in messages] == ['{"ok":true,"result":%d}' % (i + 3) for i in range(3)]
        assert (ledger.admits, ledger.records) == (1, 0)
        search = [ToolCallRequest(id="s1", name="search_articles", arguments=b'{"query": "x"}')]
        reader = Principal("acme", "alice", ALICE.roles, ALICE.permissions | {"articles:read"})
        [message] = await executor.execute(reader, run_id, search, request_id="req_test")
        assert message.outcome == OK and (ledger.admits, ledger.records) == (2, 1)
    finally:
        await ledger.close()


async def test_an_outcome_that_comes_with_a_call_needing_approval_is_never_answered(db, ledger):
    run_id = await new_run(db)
    plan = call("create_article", '{"title": "t", "body": "b"}')
    assert plan.needs_approval
    [admission] = await ledger.admit(ALICE, run_id, [plan], request_id="req_test", now=datetime.now(UTC),
                                     ran_ahead={plan.id: computed()})
    assert (admission.decision, admission.outcome) == ("decided", "APPROVAL_REQUIRED")
    [replayed] = await admit(ledger, run_id, [call("create_article", '{"title": "t", "body": "b"}', call_id=plan.id)])
    assert (replayed.decision, replayed.outcome, replayed.content) == ("replay", "APPROVAL_REQUIRED", None)


class StatementCountingLedger(PostgresLedger):
    """The real ledger, counting the grouped admission statements it sends and their sizes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.groups: list[int] = []

    async def _admit_many(self, conn, items):
        self.groups.append(len(items))
        return await super()._admit_many(conn, items)


@pytest.mark.parametrize("lanes,max_requests", [(1, 3), (4, 64)])
async def test_group_commit_lanes_and_group_size_bound_each_statement_and_every_budget_holds(
    db, lanes, max_requests
):
    ledger = StatementCountingLedger(db, approval_ttl=timedelta(hours=1), lanes=lanes, max_requests=max_requests)
    try:
        runs = [await new_run(db, max_tool_calls=4) for _ in range(3)]
        requests = [(run_id, [call(arguments=f'{{"a": {i}, "b": 1}}')]) for run_id in runs for i in range(6)]
        results = await asyncio.gather(*(admit(ledger, run_id, plans) for run_id, plans in requests))
    finally:
        await ledger.close()
    assert max(ledger.groups) <= max_requests
    assert sum(ledger.groups) == len(requests)
    for run_id in runs:
        executed = [adm[0].decision for (r, _), adm in zip(requests, results, strict=True) if r == run_id]
        assert executed.count("execute") == 4 and executed.count("decided") == 2


def test_the_group_commit_settings_reach_the_ledger_and_size_the_driver_pool(database_url):
    settings = make_settings(database_url, database_group_commit_lanes=6, database_group_commit_max_requests=5,
                             database_pool_size=4)
    db = Database.from_settings(settings)
    ledger = create_ledger(db, approval_ttl=timedelta(hours=1), lanes=settings.database.group_commit_lanes,
                           max_requests=settings.database.group_commit_max_requests)
    assert isinstance(ledger, PostgresLedger)
    assert (ledger._admissions._lane_count, ledger._admissions._max_items) == (6, 5)
    assert (ledger._records._lane_count, ledger._records._max_items) == (6, 5)
    # Six lanes for each statement kind keep twelve connections: the pool makes room for them.
    assert db._driver_pool_size == 14


class CommitModeLedger(PostgresLedger):
    """The real ledger, running each admission statement in a transaction of its own to read
    the ``synchronous_commit`` it leaves for its commit."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commit_modes: list[str] = []

    async def _admit_many(self, conn, items):
        async with conn.transaction():
            rows = await super()._admit_many(conn, items)
            self.commit_modes.append(await conn.fetchval("SELECT current_setting('synchronous_commit')"))
        return rows


READER = Principal("acme", "alice", ALICE.roles, ALICE.permissions | {"articles:read"})


@pytest.fixture
async def commit_ledger(db: Database):
    led = CommitModeLedger(db, approval_ttl=timedelta(hours=1))
    yield led
    await led.close()


def search(call_id: str | None = None):
    return plan_call(REGISTRY, READER, ToolCallRequest(id=call_id or uuid.uuid4().hex, name="search_articles",
                                                       arguments=b'{"query": "x"}'))


async def test_a_claim_of_a_read_only_call_commits_without_waiting_for_its_flush(db, commit_ledger):
    run_id = await new_run(db)
    [admission] = await commit_ledger.admit(READER, run_id, [search()], request_id="req_test", now=datetime.now(UTC))
    assert admission.decision == "execute"
    assert commit_ledger.commit_modes == ["off"]


async def test_every_statement_that_answers_or_writes_data_commits_durably(db, commit_ledger):
    run_id = await new_run(db, max_tool_calls=1)
    pure = call()
    answered = [
        # a pure call that ran ahead: answered from this statement, with its audit row
        await commit_ledger.admit(ALICE, run_id, [pure], request_id="req_test", now=datetime.now(UTC),
                                  ran_ahead={pure.id: computed()}),
        # a read-only call over the budget: refused here, audited here
        await commit_ledger.admit(READER, run_id, [search()], request_id="req_test", now=datetime.now(UTC)),
        # a replay: answered from what is stored
        await commit_ledger.admit(ALICE, run_id, [call(call_id=pure.id)], request_id="req_test",
                                  now=datetime.now(UTC)),
    ]
    assert [a[0].decision for a in answered] == ["executed", "decided", "replay"]
    other = await new_run(db)
    # a call that waits for approval creates the approval here
    [approval] = await commit_ledger.admit(ALICE, other, [call("create_article", '{"title": "t", "body": "b"}')],
                                           request_id="req_test", now=datetime.now(UTC))
    assert approval.outcome == "APPROVAL_REQUIRED"
    # a read-only claim sharing its statement with a refusal commits with the refusal
    not_permitted = plan_call(REGISTRY, ALICE, ToolCallRequest(id="np", name="search_articles",
                                                                arguments=b'{"query": "x"}'))
    [claim, refused] = await commit_ledger.admit(
        READER, other, [search(), not_permitted], request_id="req_test", now=datetime.now(UTC)
    )
    assert (claim.decision, refused.outcome) == ("execute", "PERMISSION_DENIED")
    assert commit_ledger.commit_modes == ["on"] * 5


def test_only_a_call_of_a_tool_that_changes_nothing_is_marked_read_only():
    from gateway.execution.guards import admission_payload

    assert admission_payload(search()).get("read_only") is True
    writer = call("create_article", '{"title": "t", "body": "b"}')
    assert "read_only" not in admission_payload(writer)
    refused = plan_call(REGISTRY, ALICE, ToolCallRequest(id="r", name="search_articles", arguments=b'{"query": "x"}'))
    assert refused.rejected is not None and "read_only" not in admission_payload(refused)
