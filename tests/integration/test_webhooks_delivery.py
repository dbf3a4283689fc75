"""Webhook delivery end to end on PostgreSQL: the outbox the triggers fill in the change's own
transaction, and the worker that sends it to real receivers on loopback ports — signed, retried
with the same webhook-id, dead-lettered, never following redirects, unhurt by hostile answers."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from gateway.db.models import Approval, Run, ToolCall, WebhookDelivery, WebhookSubscription
from gateway.settings import WebhookSettings
from gateway.webhooks.service import WebhookService
from gateway.webhooks.worker import WebhookWorker
from tests.support.db import open_database
from tests.support.tls import client_context, server_context
from tests.support.tools import Probe, registry_with_probe
from tests.support.webhook_receiver import WebhookReceiver, verify_standard_webhook

approvals = Approval.__table__
runs = Run.__table__
tool_calls = ToolCall.__table__
deliveries = WebhookDelivery.__table__
subscriptions = WebhookSubscription.__table__

FAST = dict(allowed_hosts=("127.0.0.1",), timeout_s=2.0, retry_base_s=0.01, retry_max_s=0.02, interval_s=0,
            lease_s=30.0)
SENSITIVE = "hunter2-sensitive-argument"


@pytest.fixture
async def db(seeded_pg_url):
    async with open_database(seeded_pg_url) as database:
        yield database


def worker_for(db: Any, *, verify: Any = True, registry: Any = None, **overrides: Any) -> WebhookWorker:
    return WebhookWorker(db, WebhookSettings(**{**FAST, **overrides}), public_base_url="https://gw.example.com",
                         verify=verify, registry=registry)


async def subscribe(db: Any, url: str, events: list[str], *, tenant: str = "acme", format: str = "standard",
                    **settings: Any) -> Any:
    service = WebhookService(db=db, settings=WebhookSettings(**{**FAST, **settings}))
    return await service.create(tenant_id=tenant, actor="carol", url=url, events=events, format=format)


async def insert_approval(conn: Any, *, tenant: str = "acme", expires_in_s: float = 3600, tool: str = "write_note") -> str:
    """A pending approval as the ledger writes one: its run, its held-back call, its frozen arguments."""
    now = datetime.now(UTC)
    run_id = "run_" + secrets.token_hex(6)
    approval_id = "apr_" + secrets.token_hex(6)
    await conn.execute(sa.insert(runs).values(id=run_id, tenant_id=tenant, user_id="bob", max_tool_calls=10,
                                              max_repeats=2, created_at=now))
    await conn.execute(sa.insert(tool_calls).values(run_id=run_id, tool_call_id="w1", tenant_id=tenant,
                                                    tool=tool, status="pending", approval_id=approval_id,
                                                    created_at=now))
    await conn.execute(sa.insert(approvals).values(
        id=approval_id, tenant_id=tenant, run_id=run_id, tool_call_id="w1", requester_id="bob",
        requester_roles=["editor"], tool=tool, canonical_arguments=f'{{"text":"{SENSITIVE}"}}',
        arguments_sha256="0" * 64, status="pending", created_at=now, expires_at=now + timedelta(seconds=expires_in_s),
    ))
    return approval_id


async def outbox(db: Any, **where: Any) -> list[Any]:
    async with db.connect() as conn:
        stmt = sa.select(deliveries).where(*(deliveries.c[k] == v for k, v in where.items()))
        return list((await conn.execute(stmt.order_by(deliveries.c.created_at))).all())


async def drain(worker: WebhookWorker, db: Any, *, rounds: int = 200) -> None:
    """Rounds until nothing is pending or in flight (bounded)."""
    for _ in range(rounds):
        await worker.run_once()
        left = [r for r in await outbox(db) if r.state in ("pending", "in_flight")]
        if not left:
            return
        await _pause()
    raise AssertionError("deliveries still pending after the rounds allowed")


async def _pause() -> None:
    import asyncio

    await asyncio.sleep(0.02)


async def test_a_delivery_is_signed_the_standard_webhooks_way_and_carries_no_arguments(db):
    async with WebhookReceiver() as receiver:
        created = await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            approval_id = await insert_approval(conn)
        worker = worker_for(db)
        try:
            await drain(worker, db)
        finally:
            await worker.stop()
        (request,) = receiver.requests
    assert verify_standard_webhook(created.secret, request.headers, request.body)
    other_secret = (await subscribe(db, receiver.url, ["run.stopped"])).secret
    assert not verify_standard_webhook(other_secret, request.headers, request.body)
    assert not verify_standard_webhook(created.secret, request.headers, request.body + b" ")
    body = request.json()
    assert set(body) == {"type", "timestamp", "data"} and body["type"] == "approval.created"
    assert body["timestamp"].endswith("Z")
    data = body["data"]
    assert (data["approval_id"], data["tool"], data["status"], data["requester_id"]) == (
        approval_id, "write_note", "pending", "bob")
    assert data["console_url"] == f"https://gw.example.com/console/approvals/{approval_id}"
    assert SENSITIVE not in request.body.decode() and "arguments" not in data
    assert request.headers["webhook-id"].startswith("msg_") and request.headers["content-type"] == "application/json"
    (row,) = await outbox(db)
    assert (row.id, row.state, row.attempts, row.last_status) == (request.headers["webhook-id"], "delivered", 1, 204)


@pytest.mark.parametrize(("tool", "with_registry", "hash_sent"), [
    ("write_note", True, True),
    ("store_secret", True, False),  # marks a field sensitive: a receiver could test guesses of it
    ("no_such_tool", True, False),
    ("write_note", False, False),
])
async def test_an_approval_event_carries_the_arguments_hash_only_for_a_tool_known_to_hide_nothing(
    db, tool, with_registry, hash_sent
):
    async with WebhookReceiver() as receiver:
        await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn, tool=tool)
        worker = worker_for(db, registry=registry_with_probe(Probe()) if with_registry else None)
        try:
            await drain(worker, db)
        finally:
            await worker.stop()
        (request,) = receiver.requests
    data = request.json()["data"]
    assert data["tool"] == tool
    assert data["arguments_sha256"] == ("0" * 64 if hash_sent else None)


async def test_a_receiver_failing_three_times_gets_one_logical_delivery_with_one_webhook_id(db):
    async with WebhookReceiver(behaviour=lambda n, _: "fail" if n <= 3 else "ok") as receiver:
        created = await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn)
        worker = worker_for(db)
        try:
            await drain(worker, db)
        finally:
            await worker.stop()
    assert len(receiver.requests) == 4
    assert len({r.headers["webhook-id"] for r in receiver.requests}) == 1
    assert len({r.body for r in receiver.requests}) == 1
    assert all(verify_standard_webhook(created.secret, r.headers, r.body) for r in receiver.requests)
    (row,) = await outbox(db)
    assert (row.state, row.attempts, row.last_status) == ("delivered", 4, 204)


async def test_a_receiver_that_never_answers_is_dead_lettered_once_the_retry_window_passes(db):
    async with WebhookReceiver(behaviour=lambda n, _: "hang") as receiver:
        await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn)
        worker = worker_for(db, timeout_s=0.2, retry_window_s=0.6, retry_base_s=0.05)
        try:
            await drain(worker, db)
        finally:
            await worker.stop()
    (row,) = await outbox(db)
    assert (row.state, row.last_error, row.last_status) == ("dead", "timeout", None)
    assert row.attempts >= 2 and len(receiver.requests) == row.attempts
    assert row.dead_at is not None


async def test_a_rolled_back_approval_announces_nothing(db):
    await subscribe(db, "http://127.0.0.1:9/hook", ["approval.created"])
    async with db.connect() as conn:
        transaction = await conn.begin()
        await insert_approval(conn)
        inside = (await conn.execute(sa.select(sa.func.count()).select_from(deliveries))).scalar()
        await transaction.rollback()
    assert inside == 1  # the trigger wrote it in the approval's own transaction ...
    assert await outbox(db) == []  # ... and it went with it


async def test_only_tenants_subscribed_to_the_event_get_outbox_rows(db):
    await subscribe(db, "http://127.0.0.1:9/hook", ["approval.decided"])
    async with db.begin() as conn:
        await insert_approval(conn)  # acme: created, which it did not ask for
        await insert_approval(conn, tenant="globex")  # globex: no webhooks at all
    assert await outbox(db) == []


async def test_decided_expired_and_run_stopped_events_are_written_by_their_changes(db):
    created = await subscribe(db, "http://127.0.0.1:9/hook",
                              ["approval.decided", "approval.expired", "run.stopped"])
    async with db.begin() as conn:
        decided = await insert_approval(conn)
        await conn.execute(sa.update(approvals).where(approvals.c.id == decided)
                           .values(status="executing", decided_by="carol", decided_at=datetime.now(UTC)))
        await conn.execute(sa.update(approvals).where(approvals.c.id == decided).values(status="succeeded"))
        stopped_run = (await conn.execute(sa.select(approvals.c.run_id).where(approvals.c.id == decided))).scalar()
        await conn.execute(sa.update(runs).where(runs.c.id == stopped_run).values(used_tool_calls=3))
        await conn.execute(sa.update(runs).where(runs.c.id == stopped_run)
                           .values(loop_state="stopped", stop_reason="MAX_STEPS_EXCEEDED"))
    rows = await outbox(db, subscription_id=created.subscription.id)
    assert [r.event_type for r in rows] == ["approval.decided", "run.stopped"]
    assert rows[0].data["decision"] == "approved" and rows[0].data["decided_by"] == "carol"
    assert (rows[1].data["run_id"], rows[1].data["stop_reason"]) == (stopped_run, "MAX_STEPS_EXCEEDED")


async def test_the_worker_marks_approvals_expired_by_time_so_expiry_is_announced(db):
    await subscribe(db, "http://127.0.0.1:9/hook", ["approval.expired"])
    async with db.begin() as conn:
        approval_id = await insert_approval(conn, expires_in_s=-1)
        live = await insert_approval(conn)
    worker = worker_for(db, retry_window_s=0.001)
    try:
        await worker.run_once()
    finally:
        await worker.stop()
    async with db.connect() as conn:
        states = dict((await conn.execute(sa.select(approvals.c.id, approvals.c.status))).all())
        held = (await conn.execute(sa.select(tool_calls.c.status, tool_calls.c.outcome)
                                   .where(tool_calls.c.approval_id == approval_id))).one()
    assert (states[approval_id], states[live]) == ("expired", "pending")
    assert tuple(held) == ("done", "APPROVAL_EXPIRED")
    (row,) = await outbox(db)
    assert (row.event_type, row.data["approval_id"], row.data["outcome"]) == (
        "approval.expired", approval_id, "APPROVAL_EXPIRED")


async def test_a_redirect_is_not_followed(db):
    async with WebhookReceiver() as elsewhere, WebhookReceiver(
        behaviour=lambda n, _: f"redirect:{elsewhere.url}"
    ) as receiver:
        await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn)
        worker = worker_for(db)
        try:
            await worker.run_once()
        finally:
            await worker.stop()
        assert len(receiver.requests) == 1 and elsewhere.requests == []
    (row,) = await outbox(db)
    assert (row.state, row.last_status, row.last_error) == ("pending", 307, "http_307")


async def test_an_address_no_longer_allow_listed_is_refused_at_delivery(db):
    """The rules are applied again when sending: a loopback receiver allowed when the webhook
    was made is not sent to once the allow-list no longer names it."""
    async with WebhookReceiver() as receiver:
        await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn)
        worker = worker_for(db, allowed_hosts=())
        try:
            await worker.run_once()
        finally:
            await worker.stop()
        assert receiver.requests == []
    (row,) = await outbox(db)
    assert (row.state, row.last_error) == ("pending", "url_refused")


async def test_a_stored_url_whose_host_is_not_a_valid_name_is_refused_at_delivery(db, logs):
    """A webhook stored before its URL's host was checked (a malformed punycode label) fails
    each attempt as url_refused, not as an unexpected error."""
    created = await subscribe(db, "https://hooks.example.com/x", ["approval.created"])
    async with db.begin() as conn:
        await conn.execute(sa.update(subscriptions).where(subscriptions.c.id == created.subscription.id)
                           .values(url="https://xn--zz/hook"))
        await insert_approval(conn)
    worker = worker_for(db)
    try:
        assert await worker.run_once() == 1
    finally:
        await worker.stop()
    (row,) = await outbox(db)
    assert (row.state, row.last_error, row.last_status) == ("pending", "url_refused", None)
    assert not logs.named("webhook_attempt_failed_unexpectedly")


async def test_hostile_answers_a_huge_body_and_a_slow_drip_do_not_hold_the_worker(db):
    async with WebhookReceiver(behaviour=lambda n, _: "huge") as huge, WebhookReceiver(
        behaviour=lambda n, _: "drip"
    ) as drip, WebhookReceiver() as good:
        for receiver in (huge, drip, good):
            await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn)
        worker = worker_for(db, timeout_s=1.0, max_response_bytes=4096)
        try:
            assert await worker.run_once() == 3
        finally:
            await worker.stop()
        assert len(good.requests) == 1
    rows = {r.subscription_id: r for r in await outbox(db)}
    assert {(r.state, r.last_status) for r in rows.values()} == {("delivered", 200), ("delivered", 204)}
    # The gateway hung up after a few KB: what the huge receiver got out is what the sockets' buffers took.
    assert huge.huge_bytes_sent < 64 * 1024 * 1024


async def test_a_slack_webhook_gets_a_text_body_with_the_console_link(db):
    async with WebhookReceiver() as receiver:
        await subscribe(db, receiver.url, ["approval.created"], format="slack")
        async with db.begin() as conn:
            approval_id = await insert_approval(conn)
        worker = worker_for(db)
        try:
            await drain(worker, db)
        finally:
            await worker.stop()
    (request,) = receiver.requests
    body = msgspec.json.decode(request.body)
    assert list(body) == ["text"]
    assert f"<https://gw.example.com/console/approvals/{approval_id}|Open in the console>" in body["text"]
    assert "write_note" in body["text"] and SENSITIVE not in body["text"]


async def test_https_goes_to_the_checked_address_and_the_certificate_is_verified(db):
    async with WebhookReceiver(tls=server_context()) as receiver:
        await subscribe(db, receiver.url, ["approval.created"])
        async with db.begin() as conn:
            await insert_approval(conn)
        untrusting = worker_for(db)  # the system's CAs: the receiver's own certificate is not trusted
        try:
            await untrusting.run_once()
        finally:
            await untrusting.stop()
        assert receiver.requests == []
        (row,) = await outbox(db)
        assert (row.state, row.last_error) == ("pending", "connection_failed")
        async with db.begin() as conn:
            await conn.execute(sa.update(deliveries).values(next_attempt_at=datetime.now(UTC)))
        trusting = worker_for(db, verify=client_context())
        try:
            await drain(trusting, db)
        finally:
            await trusting.stop()
        (request,) = receiver.requests
    assert request.headers["host"] == receiver.url.split("/")[2]
    (row,) = await outbox(db)
    assert (row.state, row.attempts) == ("delivered", 2)
