"""A request cancelled while its calls run (the agent loop's run deadline, shutdown) leaves
each call stored and audited as TOOL_CALL_CANCELLED — also a call of a tool that changes data
and runs without approval, which records itself with its writes. PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.db.policies import ApprovalMode, TenantPolicies, ToolPolicy
from gateway.db.runs import create_run
from gateway.execution.executor import ToolExecutor
from gateway.execution.ledger import create_ledger
from gateway.execution.protocol import ToolCallRequest
from gateway.observability.metrics import Metrics
from tests.support import db as rows
from tests.support.app import make_settings
from tests.support.tools import Probe, registry_with_probe

pytestmark = pytest.mark.postgres

WAIVED = TenantPolicies({"slow_write": ToolPolicy(approval_mode=ApprovalMode.NEVER, approval_waived=True,
                                                       timeout_s=10)})
BOB = Principal("acme", "bob", frozenset({"editor"}), frozenset({"articles:write", "time:read"}), tool_policies=WAIVED)


async def _cancelled_while_running(executor: ToolExecutor, run_id: str, requests: list[ToolCallRequest]) -> None:
    task = asyncio.ensure_future(executor.execute(BOB, run_id, requests, request_id="req_cancelled"))
    await asyncio.sleep(0.3)
    assert not task.done(), task.result()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_call_that_changes_data_unapproved_is_stored_and_audited_as_cancelled(
    db: Database, database_url: str
):
    """A review's reproduction: such a call, cancelled, recorded nothing, so its replays said
    TOOL_CALL_IN_PROGRESS for twenty minutes and no audit row told of it."""
    probe = Probe()
    ledger = create_ledger(db, approval_ttl=timedelta(hours=1))
    executor = ToolExecutor(settings=make_settings(database_url), db=db, registry=registry_with_probe(probe),
                            ledger=ledger, metrics=Metrics())
    try:
        async with db.begin() as conn:
            run = await create_run(conn, tenant_id="acme", user_id="bob", max_tool_calls=10, max_repeats=2,
                                   expires_at=None, now=datetime.now(UTC))
        slow = ToolCallRequest(id="w1", name="slow_write", arguments=b'{"seconds": 5}')
        await _cancelled_while_running(executor, run.id, [slow])
        assert probe.cancelled == ["w1"]

        [replayed] = await executor.execute(BOB, run.id, [slow], request_id="req_replay")
        assert replayed.outcome == "TOOL_CALL_CANCELLED", replayed
        audited = await rows.audit_rows(database_url, run_id=run.id, tool_call_id="w1", kind="tool_call")
        assert [row.outcome for row in audited] == ["TOOL_CALL_CANCELLED"]
        assert await rows.articles(database_url, title="slow write") == []
    finally:
        await ledger.close()


async def test_an_approval_cancelled_while_its_call_runs_ends_failed_cancelled_not_executing(
    db: Database, database_url: str
):
    """Before, an approver's request cancelled while the approved call ran left the approval
    `executing` for good and the held-back call without an outcome."""
    from gateway.auth.directory import TenantDirectory
    from gateway.db import policies as pq
    from gateway.execution.approvals import ApprovalService

    probe = Probe()
    registry = registry_with_probe(probe)
    settings = make_settings(database_url)
    async with db.begin() as conn:
        await pq.put_policy(conn, tenant_id="acme", tool="slow_write", policy=ToolPolicy(timeout_s=10),
                            updated_by="carol", now=datetime.now(UTC))
        run = await create_run(conn, tenant_id="acme", user_id="bob", max_tool_calls=10, max_repeats=2,
                               expires_at=None, now=datetime.now(UTC))
    directory = TenantDirectory(db, ttl_s=0)
    bob = await directory.principal("acme", "bob", ["editor"])
    carol = await directory.principal("acme", "carol", ["admin"])
    ledger = create_ledger(db, approval_ttl=timedelta(hours=1))
    executor = ToolExecutor(settings=settings, db=db, registry=registry, ledger=ledger, metrics=Metrics())
    approvals = ApprovalService(settings=settings, db=db, registry=registry, directory=directory, metrics=Metrics())
    try:
        slow = ToolCallRequest(id="w1", name="slow_write", arguments=b'{"seconds": 5}')
        [held] = await executor.execute(bob, run.id, [slow], request_id="req_held")
        assert held.outcome == "APPROVAL_REQUIRED" and held.error is not None
        task = asyncio.ensure_future(approvals.approve(carol, held.error.approval_id, request_id="req_approve"))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert probe.cancelled == ["w1"]

        [approval] = await rows.approvals(database_url, id=held.error.approval_id)
        assert (approval.status, approval.outcome) == ("failed", "TOOL_CALL_CANCELLED")
        [replayed] = await executor.execute(bob, run.id, [slow], request_id="req_replay")
        assert replayed.outcome == "TOOL_CALL_CANCELLED"
        audited = await rows.audit_rows(database_url, run_id=run.id, tool_call_id="w1", kind="tool_call")
        assert [row.outcome for row in audited] == ["APPROVAL_REQUIRED", "TOOL_CALL_CANCELLED"]
        assert await rows.articles(database_url, title="slow write") == []
    finally:
        await ledger.close()


async def test_a_cancellation_or_error_after_the_call_committed_leaves_its_outcome_and_audits_nothing_more(
    db: Database, database_url: str
):
    """A review's reproduction (a 50 ms link to the database): the request cancelled while the
    call's COMMIT was on its way overwrote the stored OK with TOOL_CALL_CANCELLED and audited
    the call twice, its write committed."""
    from gateway.audit.rows import AuditRow, append_audit
    from gateway.db import approvals as q
    from gateway.execution.transactional import TransactionalCalls, failure
    from gateway.errors import ErrorCode

    probe = Probe()
    ledger = create_ledger(db, approval_ttl=timedelta(hours=1))
    settings = make_settings(database_url)
    executor = ToolExecutor(settings=settings, db=db, registry=registry_with_probe(probe), ledger=ledger,
                            metrics=Metrics())
    try:
        async with db.begin() as conn:
            run = await create_run(conn, tenant_id="acme", user_id="bob", max_tool_calls=10, max_repeats=2,
                                   expires_at=None, now=datetime.now(UTC))
        quick = ToolCallRequest(id="w1", name="slow_write", arguments=b'{"seconds": 0}')
        [done] = await executor.execute(BOB, run.id, [quick], request_id="req_done")
        assert done.outcome == "OK"

        async def record(conn, outcome) -> None:
            await q.store_call_outcome(conn, tenant_id="acme", run_id=run.id, tool_call_id="w1",
                                       outcome=outcome.outcome, content=outcome.content, now=datetime.now(UTC))
            await append_audit(conn, AuditRow(tenant_id="acme", kind="tool_call", outcome=outcome.outcome,
                                              created_at=datetime.now(UTC), run_id=run.id, tool_call_id="w1"))

        calls = TransactionalCalls(settings=settings, db=db)
        late = failure(ErrorCode.TOOL_CALL_CANCELLED, None)
        assert await calls.record_unless_finished("acme", run.id, "w1", record, late) is False
        # The same for an error raised once the COMMIT had landed (its answer lost on the way):
        # the stored OK stands and this answer says the outcome is unknown.
        answered = await calls.record_failure("acme", run.id, "w1", record, "err_lost_commit")
        assert answered.error is not None and answered.error.code == "TOOL_OUTCOME_UNKNOWN"
        [replayed] = await executor.execute(BOB, run.id, [quick], request_id="req_replay")
        assert replayed.outcome == "OK"
        audited = await rows.audit_rows(database_url, run_id=run.id, tool_call_id="w1", kind="tool_call")
        assert [row.outcome for row in audited] == ["OK"]
    finally:
        await ledger.close()
