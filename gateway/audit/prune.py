"""``gateway audit prune --older-than 90d``: retention by whole months, keeping every chain
verifiable.

``audit_events`` is partitioned by UTC month of ``created_at``; retention drops the partition
of every month that ended at or before the cut-off (``now - older_than``), never deletes a row.
So a row is kept until its whole month is older than the cut-off: up to a month longer than
asked, never shorter. The months are shared by all tenants: a prune is for every tenant.

In one transaction, holding the sealers' turn (no batch is sealed meanwhile):

1. the partitions are made ahead (rows in the default partition move into their month);
2. every row of a finished transaction is sealed (``seal_batch``), so that a month is not
   kept back by the sealer's lag;
3. a month with a row still not sealed (its transaction was running; it is above the
   watermark, without a link) is kept, and so is every later month: only the oldest months go;
4. per tenant, the chain's start (``anchor_seq`` in ``audit_chains``, its hash the chain hash
   there) moves to the highest position below which every row goes (see below), keeping the
   link it replaces (``start_*``: verify checks the start's hash and month against it); the links up
   to it (``audit_links``) are deleted, which the database allows only behind the anchor; the
   prune is audited in each tenant's chain (``audit_prune``: ``through_chain_seq`` is the new
   start, ``months`` the months dropped), and ``audit verify`` accepts a start only with it;
5. ``audit_events`` is locked (ACCESS EXCLUSIVE: running inserts finish first, new ones wait
   until the commit; ``lock_timeout`` 5 s) and the months are checked again for rows written
   since step 3; if one was, the whole prune rolls back and is tried again (up to three
   times), else the partitions are dropped.

Rows sealed out of ``created_at`` order near a month boundary: the chain's order is the order
of sealing, and a row's ``created_at`` is the time its request was given, so a row of the
next month (kept) may have been sealed before a row of the dropped month. The start then
stays below the first kept row, and the links of the dropped rows after it stay too (narrow
rows, without their audit rows): every row still there remains chained to the rows after it,
and ``audit verify`` checks the chain through those links, knowing from the prune's record that
their rows' months were dropped. They go with the kept row's month.

The link table is not partitioned: its primary key ``(tenant_id, chain_seq)`` is what makes a
chain position unique, and a partitioned table can enforce uniqueness only with the partition
key in it. Deleting the links of the dropped months is one range of narrow rows per tenant,
cheap next to deleting the wide audit rows (which the drop spares).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.chain import audit_events, audit_links
from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import audit_chains, ensure_partitions, seal_batch, take_turn, unsealed, watermark
from gateway.db.engine import Database

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_MONTH = re.compile(r"^audit_events_p(\d{4,})_(\d{2})$")
SEAL_BATCH = 1000
ATTEMPTS = 3


MAX_AGE = timedelta(days=100 * 366)


def parse_age(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w``; at most a hundred years."""
    match = _DURATION.match(text)
    if match is None or len(match.group(1)) > 12 or int(match.group(1)) < 1:
        raise ValueError(f"{text[:40]!r} is not an age like 90d, 12h, 30m or 2w")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_AGE.total_seconds():
        raise ValueError(f"{text[:40]!r} is longer than a hundred years")
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class PruneResult:
    tenant_id: str
    removed_rows: int
    anchor_seq: int


@dataclass(frozen=True, slots=True)
class Month:
    partition: str
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class Pruned:
    months: tuple[str, ...]
    """The partitions dropped, oldest first."""
    tenants: tuple[PruneResult, ...]
    """Each tenant that had rows in them."""
    kept_unsealed: str | None = None
    """The first month old enough to drop but kept for a row not sealed yet."""


class PruneRaced(Exception):
    """A row was written into a month being dropped after it was checked."""


def _next_month(start: datetime) -> datetime:
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


async def months(conn: AsyncConnection) -> list[Month]:
    """The monthly partitions of ``audit_events``, oldest first."""
    names = (
        await conn.execute(
            sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'audit_events'::regclass"
            )
        )
    ).scalars()
    found = []
    for name in names:
        match = _MONTH.fullmatch(name)
        if match:
            start = datetime(int(match.group(1)), int(match.group(2)), 1, tzinfo=UTC)
            found.append(Month(name, start, _next_month(start)))
    return sorted(found, key=lambda m: m.start)


async def _unsealed_in(conn: AsyncConnection, month: Month, mark: tuple[int, int]) -> bool:
    found = await conn.scalar(
        sa.select(audit_events.c.id)
        .where(audit_events.c.created_at >= month.start, audit_events.c.created_at < month.end, unsealed(mark))
        .limit(1)
    )
    return found is not None


async def _prune_once(conn: AsyncConnection, *, cutoff: datetime, now: datetime) -> Pruned:
    await take_turn(conn, wait=True)
    await ensure_partitions(conn)
    while (await seal_batch(conn, batch_size=SEAL_BATCH)).read == SEAL_BATCH:
        pass
    mark = await watermark(conn)
    dropping: list[Month] = []
    kept_unsealed = None
    for month in await months(conn):
        if month.end > cutoff:
            break
        if await _unsealed_in(conn, month, mark):
            kept_unsealed = month.partition
            break
        dropping.append(month)
    if not dropping:
        return Pruned((), (), kept_unsealed)
    end = dropping[-1].end
    link = audit_links.c
    removed = (
        await conn.execute(
            sa.select(audit_events.c.tenant_id, sa.func.count())
            .where(audit_events.c.created_at < end)
            .group_by(audit_events.c.tenant_id)
            .order_by(audit_events.c.tenant_id)
        )
    ).all()
    results = []
    for tenant_id, count in removed:
        chain = (await conn.execute(sa.select(audit_chains).where(audit_chains.c.tenant_id == tenant_id))).first()
        cut = await conn.scalar(
            sa.select(sa.func.max(link.chain_seq)).where(link.tenant_id == tenant_id, link.created_at < end)
        )
        if chain is None or cut is None:  # rows never sealed (written behind the sealer's back)
            continue
        kept = await conn.scalar(
            sa.select(sa.func.min(link.chain_seq)).where(
                link.tenant_id == tenant_id, link.created_at >= end, link.chain_seq < cut
            )
        )
        start = chain.anchor_seq
        moved: dict[str, Any] = {}
        if (cut if kept is None else kept - 1) > start:
            start = cut if kept is None else kept - 1
            # The start keeps the link it replaces: verify recomputes the start's hash from it,
            # and its time, before the oldest month kept, says that it was a dropped month's.
            gone = (
                await conn.execute(
                    sa.select(link.chain_hash, link.prev_hash, link.content_hash, link.created_at, link.hash_version)
                    .where(link.tenant_id == tenant_id, link.chain_seq == start)
                )
            ).one()
            moved = {
                "anchor_seq": start, "anchor_hash": gone.chain_hash, "start_prev_hash": gone.prev_hash,
                "start_content_hash": gone.content_hash, "start_linked_at": gone.created_at,
                "start_hash_version": gone.hash_version,
            }
        # The anchor moves first: the database deletes only links already behind their
        # tenant's anchor (migration 0013).
        await conn.execute(
            sa.update(audit_chains)
            .where(audit_chains.c.tenant_id == tenant_id)
            .values(**moved, pruned_rows=audit_chains.c.pruned_rows + count, updated_at=now)
        )
        await conn.execute(sa.delete(audit_links).where(link.tenant_id == tenant_id, link.chain_seq <= start))
        await append_audit(
            conn,
            AuditRow(
                tenant_id=tenant_id, kind="audit_prune", outcome="OK", created_at=now,
                detail={
                    "removed_rows": count, "through_chain_seq": start, "older_than": cutoff.isoformat(),
                    "months": [m.start.strftime("%Y-%m") for m in dropping],
                },
            ),
        )
        results.append(PruneResult(tenant_id, count, start))
    await conn.execute(sa.text("SET LOCAL lock_timeout = '5s'"))
    await conn.execute(sa.text("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE"))
    for month in dropping:
        if await _unsealed_in(conn, month, mark):
            raise PruneRaced(f"a row was written into {month.partition} while it was being pruned")
    for month in dropping:
        await conn.execute(sa.text(f'DROP TABLE "{month.partition}"'))
    return Pruned(tuple(m.partition for m in dropping), tuple(results), kept_unsealed)


async def prune(db: Database, *, older_than: timedelta, now: datetime | None = None) -> Pruned:
    """Drop the months older than ``older_than`` (see the module's docstring)."""
    now = now or datetime.now(UTC)
    cutoff = now - older_than
    for attempt in range(1, ATTEMPTS + 1):
        try:
            async with db.begin() as conn:
                return await _prune_once(conn, cutoff=cutoff, now=now)
        except PruneRaced:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")
