"""Tenant-scoped queries of webhook subscriptions and their deliveries, and the worker's
claim and record statements (one statement each)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import WebhookDelivery, WebhookSubscription

subscriptions = WebhookSubscription.__table__
deliveries = WebhookDelivery.__table__

DELIVERY_STATES = ("pending", "in_flight", "delivered", "dead")

_PUBLIC_COLUMNS = [c for c in subscriptions.c if c.name != "secret"]
"""What is read back about a subscription: everything but its secret."""


async def insert_subscription(conn: AsyncConnection, **values: Any) -> None:
    await conn.execute(sa.insert(subscriptions).values(**values))


async def list_subscriptions(conn: AsyncConnection, *, tenant_id: str) -> list[Any]:
    return list(
        (
            await conn.execute(
                sa.select(*_PUBLIC_COLUMNS)
                .where(subscriptions.c.tenant_id == tenant_id)
                .order_by(subscriptions.c.created_at, subscriptions.c.id)
            )
        ).all()
    )


async def get_subscription(conn: AsyncConnection, *, tenant_id: str, subscription_id: str) -> Any | None:
    return (
        await conn.execute(
            sa.select(*_PUBLIC_COLUMNS).where(
                subscriptions.c.tenant_id == tenant_id, subscriptions.c.id == subscription_id
            )
        )
    ).first()


async def delete_subscription(conn: AsyncConnection, *, tenant_id: str, subscription_id: str) -> bool:
    result = await conn.execute(
        sa.delete(subscriptions).where(subscriptions.c.tenant_id == tenant_id, subscriptions.c.id == subscription_id)
    )
    return result.rowcount == 1


async def list_deliveries(
    conn: AsyncConnection, *, tenant_id: str, subscription_id: str | None, state: str | None, limit: int
) -> list[Any]:
    """Newest first."""
    stmt = sa.select(deliveries).where(deliveries.c.tenant_id == tenant_id)
    if subscription_id is not None:
        stmt = stmt.where(deliveries.c.subscription_id == subscription_id)
    if state is not None:
        stmt = stmt.where(deliveries.c.state == state)
    stmt = stmt.order_by(deliveries.c.created_at.desc(), deliveries.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).all())


async def get_delivery(conn: AsyncConnection, *, tenant_id: str, delivery_id: str) -> Any | None:
    return (
        await conn.execute(
            sa.select(deliveries).where(deliveries.c.tenant_id == tenant_id, deliveries.c.id == delivery_id)
        )
    ).first()


async def requeue_dead(
    conn: AsyncConnection, *, tenant_id: str, subscription_id: str | None, delivery_id: str, now: datetime
) -> Any | None:
    """A dead-lettered delivery due again at once, with a new retry window; None if it is not dead."""
    stmt = sa.update(deliveries).where(
        deliveries.c.tenant_id == tenant_id, deliveries.c.id == delivery_id, deliveries.c.state == "dead"
    )
    if subscription_id is not None:
        stmt = stmt.where(deliveries.c.subscription_id == subscription_id)
    result = await conn.execute(
        stmt.values(state="pending", next_attempt_at=now, window_started_at=now, dead_at=None).returning(deliveries)
    )
    return result.first()


# -- the worker -------------------------------------------------------------------------------

_WORK = sa.text(
    """
    SELECT EXISTS (SELECT 1 FROM webhook_deliveries
                    WHERE state IN ('pending', 'in_flight') AND next_attempt_at <= :now) AS due,
           EXISTS (SELECT 1 FROM webhook_subscriptions WHERE events ? 'approval.expired') AS watches_expiry
    """
)


async def work_to_do(conn: AsyncConnection, *, now: datetime) -> tuple[bool, bool]:
    """(deliveries are due, some tenant subscribes to approval.expired): one cheap read, so
    that an idle round opens no transaction."""
    row = (await conn.execute(_WORK, {"now": now})).one()
    return bool(row.due), bool(row.watches_expiry)


_CLAIM = sa.text(
    """
    WITH RECURSIVE tenants (tenant_id) AS (
        -- the tenants with deliveries pending or in flight: one probe of the index each
        SELECT min(tenant_id) FROM webhook_deliveries WHERE state IN ('pending', 'in_flight')
        UNION ALL
        SELECT (SELECT min(w.tenant_id) FROM webhook_deliveries AS w
                 WHERE w.state IN ('pending', 'in_flight') AND w.tenant_id > t.tenant_id)
          FROM tenants AS t
         WHERE t.tenant_id IS NOT NULL
    ), leased AS (
        SELECT tenant_id, count(*) AS in_flight
          FROM webhook_deliveries
         WHERE state = 'in_flight' AND next_attempt_at > :now
         GROUP BY tenant_id
    ), heads AS (
        -- each tenant's oldest due delivery, its turn after those it has in flight
        SELECT t.tenant_id, coalesce(l.in_flight, 0) + 1 AS turn, h.next_attempt_at, h.id
          FROM tenants AS t
          LEFT JOIN leased AS l ON l.tenant_id = t.tenant_id
         CROSS JOIN LATERAL (SELECT w.next_attempt_at, w.id FROM webhook_deliveries AS w
                              WHERE w.tenant_id = t.tenant_id AND w.state IN ('pending', 'in_flight')
                                AND w.next_attempt_at <= :now
                              ORDER BY w.next_attempt_at, w.id
                              LIMIT 1) AS h
    ), queue (tenants, turns, due_at, ids, tenant_id, id) AS (
        -- the tenants' due deliveries merged by (turn, next_attempt_at), one a step, as far
        -- as the claim reads: each step takes the lowest head and puts that tenant's next in
        -- its place (tenant_id, id: the delivery taken, none at the first step)
        SELECT array_agg(tenant_id), array_agg(turn), array_agg(next_attempt_at), array_agg(id),
               NULL::varchar, NULL::varchar
          -- Only tenants whose head is among the lowest can supply the lowest ranks (a tenant's
          -- rows all rank after its head); twice the limit leaves room for rows skipped as
          -- locked. So each step's arrays stay short however many tenants have rows due.
          FROM (SELECT * FROM heads ORDER BY turn, next_attempt_at LIMIT 2 * :limit) AS lowest
        UNION ALL
        SELECT q.tenants,
               array_cat(array_append(q.turns[1:p.i - 1], q.turns[p.i] + 1), q.turns[p.i + 1:]),
               array_cat(array_append(q.due_at[1:p.i - 1], n.next_attempt_at), q.due_at[p.i + 1:]),
               array_cat(array_append(q.ids[1:p.i - 1], n.id), q.ids[p.i + 1:]),
               q.tenants[p.i], q.ids[p.i]
          FROM queue AS q
         CROSS JOIN LATERAL (SELECT i FROM generate_subscripts(q.ids, 1) AS i
                              WHERE q.ids[i] IS NOT NULL
                              ORDER BY q.turns[i], q.due_at[i]
                              LIMIT 1) AS p
          LEFT JOIN LATERAL (SELECT w.next_attempt_at, w.id FROM webhook_deliveries AS w
                              WHERE w.tenant_id = q.tenants[p.i] AND w.state IN ('pending', 'in_flight')
                                AND w.next_attempt_at <= :now
                                AND (w.next_attempt_at, w.id) > (q.due_at[p.i], q.ids[p.i])
                              ORDER BY w.next_attempt_at, w.id
                              LIMIT 1) AS n ON true
    )
    UPDATE webhook_deliveries AS d
       SET state = 'in_flight', attempts = d.attempts + 1, next_attempt_at = :lease_until, last_attempt_at = :now
      FROM (SELECT w.tenant_id, w.id, w.subscription_id, w.created_at
              FROM queue AS q
             CROSS JOIN LATERAL (SELECT w.tenant_id, w.id, w.subscription_id, w.created_at
                                   FROM webhook_deliveries AS w
                                  WHERE w.tenant_id = q.tenant_id AND w.id = q.id
                                    AND w.state IN ('pending', 'in_flight') AND w.next_attempt_at <= :now
                                    FOR UPDATE SKIP LOCKED) AS w
             LIMIT :limit) AS due,
           webhook_subscriptions AS s
     -- each due row by its key and its subscription's index's (see _claimed)
     WHERE d.tenant_id = due.tenant_id AND d.id = due.id
       AND d.subscription_id = due.subscription_id AND d.created_at = due.created_at
       AND s.tenant_id = d.tenant_id AND s.id = d.subscription_id
    RETURNING d.id, d.tenant_id, d.subscription_id, d.event_type, d.data, d.created_at, d.attempts,
              d.window_started_at, s.url, s.format, s.secret
    """
)
"""Due deliveries (pending and due, or in flight past their lease: a process died mid-send)
become this process's for ``lease``; committed before anything is sent.

Tenants take turns: each tenant's due deliveries are ranked after those it has in flight
under a live lease (in any process), oldest first, and the lowest ranks are claimed first. So
a tenant with a delivery due goes ahead of another tenant's backlog, however old, and of the
retries to its receivers that never answer. Locked rows are skipped and the next ranked taken
(two processes never claim the same row); a row another process claimed since this
statement's snapshot fails the re-check of its due condition under the lock.

What it reads grows with the tenants that have deliveries pending or in flight and with the
rows it claims or skips, not with a backlog (``ix_webhook_deliveries_tenant_due``): the
tenants are found one index probe each, and ``queue`` merges their due deliveries in rank
order lazily, one step per row the claim reads; the claim locks each in that order (the
nested loop over ``queue`` keeps it) and stops at ``limit``. It must stay so: an ``ORDER BY``
over ``queue`` would read all of it, every due row."""


async def claim_due(conn: AsyncConnection, *, now: datetime, lease: timedelta, limit: int) -> list[Any]:
    rows = await conn.execute(_CLAIM, {"now": now, "lease_until": now + lease, "limit": limit})
    return list(rows.all())


def _claimed(claim: Any) -> tuple[sa.ColumnElement[bool], ...]:
    """The claimed delivery (a row ``claim_due`` returned) while this claim holds it: the attempt
    count is the claim's token. Named by its key and by its subscription's index's whole key,
    so that whichever of the two a plan kept while the table had no statistics reads it, it
    reads one row."""
    return (
        deliveries.c.tenant_id == claim.tenant_id,
        deliveries.c.id == claim.id,
        deliveries.c.subscription_id == claim.subscription_id,
        deliveries.c.created_at == claim.created_at,
        deliveries.c.state == "in_flight",
        deliveries.c.attempts == claim.attempts,
    )


async def record_delivered(conn: AsyncConnection, *, claim: Any, status: int, now: datetime) -> bool:
    """Only the holder of the claim records it."""
    result = await conn.execute(
        sa.update(deliveries)
        .where(*_claimed(claim))
        .values(state="delivered", delivered_at=now, last_status=status, last_error=None)
    )
    return result.rowcount == 1


async def record_failed(
    conn: AsyncConnection,
    *,
    claim: Any,
    status: int | None,
    error: str,
    now: datetime,
    retry_at: datetime | None,
) -> bool:
    """Due again at ``retry_at``, or dead-lettered when it is None."""
    values: dict[str, Any] = {"last_status": status, "last_error": error[:64]}
    if retry_at is None:
        values.update(state="dead", dead_at=now, next_attempt_at=now)
    else:
        values.update(state="pending", next_attempt_at=retry_at)
    result = await conn.execute(
        sa.update(deliveries)
        .where(*_claimed(claim))
        .values(**values)
    )
    return result.rowcount == 1


_EXPIRE_DUE_APPROVALS = sa.text(
    """
    WITH due AS (
        SELECT d.tenant_id, d.id, d.run_expired
          FROM (SELECT DISTINCT s.tenant_id FROM webhook_subscriptions s WHERE s.events ? 'approval.expired') AS t
         CROSS JOIN LATERAL (
               SELECT a.tenant_id, a.id,
                      EXISTS (SELECT 1 FROM runs r
                               WHERE r.tenant_id = a.tenant_id AND r.id = a.run_id AND r.expires_at <= :now)
                          AS run_expired
                 FROM approvals a
                WHERE a.tenant_id = t.tenant_id AND a.status = 'pending'
                  AND (a.expires_at <= :now
                       OR EXISTS (SELECT 1 FROM runs r
                                   WHERE r.tenant_id = a.tenant_id AND r.id = a.run_id AND r.expires_at <= :now))
                LIMIT :limit
                  FOR UPDATE OF a SKIP LOCKED
               ) AS d
         LIMIT :limit
    ), expired AS (
        UPDATE approvals AS a
           SET status = 'expired',
               outcome = CASE WHEN due.run_expired THEN 'RUN_EXPIRED' ELSE 'APPROVAL_EXPIRED' END,
               outcome_content = CASE WHEN due.run_expired THEN :run_expired_content ELSE :approval_expired_content END,
               finished_at = :now
          FROM due
         WHERE a.tenant_id = due.tenant_id AND a.id = due.id AND a.status = 'pending'
        RETURNING a.tenant_id, a.run_id, a.tool_call_id, a.outcome, a.outcome_content
    )
    UPDATE tool_calls AS t
       SET status = 'done', outcome = e.outcome, content = e.outcome_content, finished_at = :now
      FROM expired AS e
     WHERE t.tenant_id = e.tenant_id AND t.run_id = e.run_id AND t.tool_call_id = e.tool_call_id
    RETURNING t.run_id
    """
)
"""Pending approvals that can no longer be decided (they or their run expired) marked
expired, as a decision attempt would (gateway.db.approvals.expire_if_due, with the
held-back call's outcome stored): only for tenants with an ``approval.expired`` webhook,
whose trigger then announces it. Elsewhere such an approval reads as expired by
comparison (gateway.execution.approvals.effective_status) as before.

It reads the subscribed tenants' pending approvals only, each tenant's through its index
(``tenant_id, status, created_at``), and updates the few it found by key: sequential scans,
hash and merge joins off, or the planner reads the whole table (every tenant's pending
approvals) to find them or to join them, each round of every process (500,000 pending of one
tenant without such a webhook: 93–108 ms a round; 0.3 ms so)."""


async def expire_due_approvals(conn: AsyncConnection, *, now: datetime, contents: dict[str, str], limit: int) -> int:
    """In the caller's transaction, which is the sweep's own (its planner setting stays in it)."""
    for setting in ("enable_seqscan", "enable_hashjoin", "enable_mergejoin"):
        await conn.execute(sa.text(f"SET LOCAL {setting} = off"))
    result = await conn.execute(
        _EXPIRE_DUE_APPROVALS,
        {
            "now": now,
            "limit": limit,
            "run_expired_content": contents["RUN_EXPIRED"],
            "approval_expired_content": contents["APPROVAL_EXPIRED"],
        },
    )
    return len(result.all())
