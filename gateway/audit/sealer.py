"""The sealer: links audit rows into their tenant's hash chain, off the request path.

The hot path only inserts audit rows, and nothing ever changes one: a row is sealed by a
narrow row in ``audit_links`` (its chain position, content hash, previous hash and chain
hash), never by an UPDATE of the wide row (that UPDATE cost about 60 µs of server CPU per
row under load, and left a dead row version behind every audit row).

Which rows are not sealed yet: every audit row carries the id of the transaction that
inserted it (``txid``, ``pg_current_xact_id()``). Below the horizon (``horizon``: the oldest
transaction of this database still running, from ``pg_current_snapshot()``) every
transaction that could write audit rows has finished, so no row with a ``txid`` below it can
appear any more. The sealer seals, in ``(txid, id)`` order, the rows above its stored
watermark (``audit_seal_state``: the ``(txid, id)`` of the last row it sealed) and below that
horizon, a batch at a time, and moves the watermark to the last row it sealed. Nothing is
skipped (a row below the horizon is final when it is read, and the watermark only passes rows
that were read), and the hot path pays nothing for it: no queue row to insert and delete
again, no UPDATE, one index on ``(txid, id)``.

Chosen over a queue table (an INSERT by the hot path and a DELETE by the sealer per row: two
more writes and their dead rows for every audit row, where the watermark costs none). Its
price: a transaction that stays open holds the horizon back, and rows of later transactions
wait for it (they are sealed in order once it ends; it is bounded by
``idle_in_transaction_session_timeout`` and the statement timeouts). ``audit verify`` counts
rows above the watermark without a link as not sealed yet.

A row is sealed when it has a link; the watermark only lets the sealer pass over rows it knows
are sealed, and a row it reads that has a link already (see below) is passed over, not linked
again (one probe of the link's unique key per row read). Transaction ids belong to a cluster:
a database restored into another one (``pg_dump``), or a logical replica promoted, keeps the
old cluster's ``txid`` values and watermark while its new transactions may get lower ids. The
watermark row itself tells: in the cluster that wrote it, its ``txid`` is always below the
transaction that wrote the row (its ``xmin``: the sealer writes it after the rows it passes
were below its horizon), and a restore writes it anew. A watermark at or above its own writer
belongs to another cluster: the sealer then starts just below that writer, since every row of
an earlier transaction came with the restore, at or below the old watermark, sealed. The
restored rows above that point are read as this cluster's horizon passes them: those linked
already are passed over, the others sealed. ``pg_upgrade`` and physical replicas keep the
transaction ids, and the watermark with them.

Processes take turns through a transaction-level advisory lock
(``pg_try_advisory_xact_lock``): whoever holds it seals one batch and releases it at commit;
the others skip that round. Per tenant, each row gets the next ``chain_seq``, its content
hash, the previous row's chain hash and its own, and the tenant's head in ``audit_chains``
moves on in the same transaction. Even without the lock two sealers could not both win: the
watermark and each head only move from the value they were read at, and a link is unique by
``(tenant_id, chain_seq)`` and by its audit row; a lost race rolls back and is tried again.

The chain's order is the order of sealing: ``(txid, id)``, so a row whose transaction took an
id earlier but committed later is still sealed in ``txid`` order. A row's ``created_at`` is
the time its request was given; rows near a month boundary may be sealed out of
``created_at`` order (see ``gateway/audit/prune.py`` for what retention does with them).

In its turn, at most once every ``MAINTAIN_EVERY_S`` in each process, the sealer also makes
the partitions of ``audit_events`` for the current month and ``PARTITION_MONTHS_AHEAD``
after it, and for any month whose rows sit in the default partition
(``gateway_audit_ensure_partitions``, ``gateway/db/sql/audit_partitions.sql``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import sqlalchemy as sa
import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.chain import (
    CANONICAL_FIELDS,
    LINK_HASH_VERSION,
    audit_events,
    audit_links,
    content_hash,
    genesis_hash,
    link_hash,
)
from gateway.db.engine import Database
from gateway.db.models import AuditChain, AuditSealState

log = structlog.get_logger("gateway.audit")

audit_chains = AuditChain.__table__
audit_seal_state = AuditSealState.__table__

PARTITION_MONTHS_AHEAD = 3
"""Months of ``audit_events`` partitions made ahead of the current one."""
MAINTAIN_EVERY_S = 3600.0
"""How often a process's sealer makes the partitions ahead (in its turn)."""
MAINTAIN_RETRY_S = 60.0
"""How soon after a failed attempt (a lock not granted) the partitions are tried again:
months are made three ahead, so waiting costs nothing, while every attempt that queues for
the default partition's lock holds up the readers queued behind it."""
MAINTAIN_LOCK_TIMEOUT = "100ms"

YIELD_EVERY = 50
"""Rows hashed between two yields to the event loop (about 1.5 ms of work)."""

# One key for every gateway process on the database: "gwaudit" as an integer.
SEALER_LOCK_KEY = 0x6777_6175_6469_74


class ChainRaced(Exception):
    """Another sealer moved the chain meanwhile; this batch rolls back and is tried again."""


@dataclass(frozen=True, slots=True)
class ChainState:
    head_seq: int
    head_hash: str
    exists: bool


async def take_turn(conn: AsyncConnection, *, wait: bool = False) -> bool:
    """The sealers' advisory lock for this transaction."""
    if wait:
        await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": SEALER_LOCK_KEY})
        return True
    return bool(await conn.scalar(sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": SEALER_LOCK_KEY}))


async def chain_state(conn: AsyncConnection, tenant_id: str) -> ChainState:
    row = (await conn.execute(sa.select(audit_chains).where(audit_chains.c.tenant_id == tenant_id))).first()
    if row is None:
        return ChainState(head_seq=0, head_hash=genesis_hash(tenant_id), exists=False)
    return ChainState(head_seq=row.head_seq, head_hash=row.head_hash, exists=True)


_HORIZON = sa.text(
    """
    WITH s AS (SELECT pg_current_snapshot() AS snap)
    SELECT least(pg_current_xact_id_if_assigned()::text::bigint, coalesce(
        (SELECT min(x.xid::text::bigint) FROM s, pg_snapshot_xip(s.snap) AS x(xid)
          WHERE NOT EXISTS (
                SELECT 1 FROM pg_stat_activity a
                 WHERE a.datname IS NOT NULL AND a.datname <> current_database()
                   AND a.backend_xid::text = (x.xid::text::bigint % 4294967296)::text)),
        (SELECT pg_snapshot_xmax(s.snap)::text::bigint FROM s)))
    """
)


async def horizon(conn: AsyncConnection) -> int:
    """A transaction id below which every transaction that may have written audit rows in this
    database has finished: the oldest one still running, of the current snapshot's, that is
    not known to be another database's (a server's horizon, ``pg_snapshot_xmin``, would let a
    long transaction in any other database on the server hold the sealing back). A running
    transaction it cannot place (a prepared one, a backend it may not see) counts as this
    database's. The caller's own transaction, once it has an id, is never passed either: a
    snapshot does not list its own transaction, and a transaction that seals and then writes
    audit rows (the prune) would otherwise leave its rows below the watermark, never sealed. Every row with a ``txid`` below it is final: committed and visible to any
    later snapshot, or gone."""
    return int(await conn.scalar(_HORIZON))


_WATERMARK = sa.text(
    """
    SELECT s.txid, s.audit_id, n.next - (n.next - s.xmin::text::bigint) % 4294967296 AS written_by
      FROM audit_seal_state s, (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next) n
    """
)
"""The stored watermark and the full (epoch-qualified) id of the transaction that wrote it."""

LAST_ID = 2**63 - 1


async def _watermarks(conn: AsyncConnection) -> tuple[tuple[int, int], tuple[int, int]]:
    """The stored watermark, and the one to seal from: the same, unless it came from another
    cluster (see the module's docstring)."""
    row = (await conn.execute(_WATERMARK)).first()
    if row is None:
        return (0, 0), (0, 0)
    stored = (int(row.txid), int(row.audit_id))
    if stored[0] < row.written_by:
        return stored, stored
    return stored, (int(row.written_by) - 1, LAST_ID)


async def watermark(conn: AsyncConnection) -> tuple[int, int]:
    """The ``(txid, id)`` at or below which every row is sealed. ``(0, 0)`` before the first
    seal (or once the table was emptied)."""
    return (await _watermarks(conn))[1]


_MOVE_WATERMARK = sa.text(
    """
    INSERT INTO audit_seal_state AS s (id, txid, audit_id, updated_at) VALUES (1, :txid, :audit_id, :now)
    ON CONFLICT (id) DO UPDATE SET txid = EXCLUDED.txid, audit_id = EXCLUDED.audit_id, updated_at = EXCLUDED.updated_at
     WHERE s.txid = :old_txid AND s.audit_id = :old_audit_id
    """
)


def above_watermark(mark: tuple[int, int]) -> sa.ColumnElement[bool]:
    """The rows the sealer has not passed yet (those of transactions still running included)."""
    return sa.tuple_(audit_events.c.txid, audit_events.c.id) > sa.tuple_(sa.literal(mark[0]), sa.literal(mark[1]))


def unsealed(mark: tuple[int, int]) -> sa.ColumnElement[bool]:
    """The rows not sealed yet: not passed, and without a link."""
    linked = sa.exists().where(
        audit_links.c.tenant_id == audit_events.c.tenant_id,
        audit_links.c.audit_id == audit_events.c.id,
        audit_links.c.created_at == audit_events.c.created_at,
    )
    return sa.and_(above_watermark(mark), ~linked)


_NEXT_ROWS = f"""
    SELECT a.*, l.linked FROM (
        SELECT {', '.join(CANONICAL_FIELDS)}, txid FROM audit_events
         WHERE (txid, id) > ($1::bigint, $2::bigint) AND txid < $3::bigint ORDER BY txid, id LIMIT $4::integer
    ) a
    LEFT JOIN LATERAL (
        SELECT true AS linked FROM audit_links l
         WHERE l.tenant_id = a.tenant_id AND l.audit_id = a.id AND l.created_at = a.created_at LIMIT 1
    ) l ON true
    ORDER BY a.txid, a.id
"""
"""The next rows after the watermark and below the horizon, in sealing order, each with whether
it has a link already (a lateral probe by the link's unique key: never a join over all links)."""


@dataclass(frozen=True, slots=True)
class SealedBatch:
    read: int
    """Rows the watermark moved past."""
    sealed: int
    """Of them, the rows linked now (the others had a link already)."""


async def seal_batch(conn: AsyncConnection, *, batch_size: int) -> SealedBatch:
    """Seal the rows among the next ``batch_size`` after the watermark, of finished transactions
    only; the caller holds the turn.

    The rows are read and their links written through the driver's connection, in the same
    transaction: the sealer runs in the serving process, and SQLAlchemy's result rows and
    parameter handling cost about a third of its CPU per row (the driver decodes the JSON
    columns with the same codec either way, so the hashes are the same)."""
    stored, mark = await _watermarks(conn)
    below = await horizon(conn)
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    rows = await driver.fetch(_NEXT_ROWS, mark[0], mark[1], below, batch_size)
    if not rows:
        return SealedBatch(read=0, sealed=0)
    by_tenant: dict[str, list[Any]] = {}
    for row in rows:
        if not row["linked"]:
            by_tenant.setdefault(row["tenant_id"], []).append(row)
    now = datetime.now(UTC)
    tenants: list[str] = []
    seqs: list[int] = []
    row_ids: list[int] = []
    created: list[datetime] = []
    contents: list[str] = []
    prevs: list[str] = []
    links: list[str] = []
    for tenant_id, tenant_rows in sorted(by_tenant.items()):
        state = await chain_state(conn, tenant_id)
        seq, prev = state.head_seq, state.head_hash
        for done, row in enumerate(tenant_rows, start=1):
            if done % YIELD_EVERY == 0:
                # Hashing is CPU work on the serving event loop: let requests in between.
                await asyncio.sleep(0)
            seq += 1
            content = content_hash(row)
            link = link_hash(seq, prev, content, row["created_at"])
            tenants.append(tenant_id)
            seqs.append(seq)
            row_ids.append(row["id"])
            created.append(row["created_at"])
            contents.append(content)
            prevs.append(prev)
            links.append(link)
            prev = link
        await _move_head(conn, tenant_id, state, seq, prev, now)
    # One set-based statement (a statement per row costs the server several times more).
    try:
        await driver.execute(_LINK_ROWS, tenants, seqs, row_ids, created, contents, prevs, links)
    except asyncpg.UniqueViolationError as exc:  # another sealer linked these rows meanwhile
        raise ChainRaced("these rows were linked meanwhile") from exc
    last = rows[-1]
    moved = await conn.execute(
        _MOVE_WATERMARK,
        {"txid": last["txid"], "audit_id": last["id"], "now": now, "old_txid": stored[0], "old_audit_id": stored[1]},
    )
    if moved.rowcount != 1:
        raise ChainRaced("the sealing watermark moved meanwhile")
    return SealedBatch(read=len(rows), sealed=len(links))


_LINK_ROWS = """
    INSERT INTO audit_links (tenant_id, chain_seq, audit_id, created_at, content_hash, prev_hash, chain_hash,
                             hash_version)
    SELECT *, {version} FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::timestamptz[], $5::text[], $6::text[],
                                     $7::text[])
""".format(version=LINK_HASH_VERSION)


async def ensure_partitions(conn: AsyncConnection, *, months_ahead: int = PARTITION_MONTHS_AHEAD) -> int:
    """Make the partitions of ``audit_events`` ahead, and for months whose rows sit in the
    default partition; how many were made. The caller holds the turn."""
    return int(await conn.scalar(sa.text("SELECT gateway_audit_ensure_partitions(:ahead)"), {"ahead": months_ahead}))


async def _move_head(
    conn: AsyncConnection, tenant_id: str, state: ChainState, seq: int, link: str, now: datetime
) -> None:
    if not state.exists:
        await conn.execute(
            sa.insert(audit_chains).values(
                tenant_id=tenant_id,
                head_seq=seq,
                head_hash=link,
                anchor_seq=0,
                anchor_hash=genesis_hash(tenant_id),
                pruned_rows=0,
                updated_at=now,
            )
        )
        return
    moved = await conn.execute(
        sa.update(audit_chains)
        .where(audit_chains.c.tenant_id == tenant_id, audit_chains.c.head_seq == state.head_seq)
        .values(head_seq=seq, head_hash=link, updated_at=now)
    )
    if moved.rowcount != 1:
        raise ChainRaced(f"the chain head of {tenant_id!r} moved meanwhile")


class AuditSealer:
    def __init__(self, db: Database, *, batch_size: int = 1000, interval_s: float = 1.0) -> None:
        self._db = db
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._maintained_at: float | None = None

    def _maintenance_due(self) -> bool:
        return self._maintained_at is None or time.monotonic() - self._maintained_at >= MAINTAIN_EVERY_S

    async def seal_once(self, *, wait: bool = False) -> int | None:
        """One batch in one transaction (and the partitions ahead, when due): the rows sealed;
        ``None`` when another process holds the turn."""
        batch = await self._seal_round(wait=wait)
        return None if batch is None else batch.sealed

    async def _seal_round(self, *, wait: bool) -> SealedBatch | None:
        maintain = self._maintenance_due()
        if not maintain and not await self._has_unsealed():
            return SealedBatch(read=0, sealed=0)
        try:
            async with self._db.begin() as conn:
                if not await take_turn(conn, wait=wait):
                    return None
                if maintain:
                    await self._maintain(conn)
                return await seal_batch(conn, batch_size=self._batch_size)
        except (ChainRaced, sa_exc.IntegrityError):
            log.info("audit_seal_raced")
            return SealedBatch(read=0, sealed=0)

    async def _maintain(self, conn: AsyncConnection) -> None:
        """The partitions ahead, in a savepoint: a failure (a lock not granted in time) is
        logged and tried again next round, and never stops the sealing."""
        try:
            async with conn.begin_nested():
                await conn.execute(sa.text(f"SET LOCAL lock_timeout = '{MAINTAIN_LOCK_TIMEOUT}'"))
                made = await ensure_partitions(conn)
                await conn.execute(sa.text("SET LOCAL lock_timeout = DEFAULT"))
        except sa_exc.DBAPIError:
            log.warning("audit_partitions_failed", exc_info=True, retry_in_s=MAINTAIN_RETRY_S)
            self._maintained_at = time.monotonic() - MAINTAIN_EVERY_S + MAINTAIN_RETRY_S
            return
        self._maintained_at = time.monotonic()
        if made:
            log.info("audit_partitions_made", partitions=made)

    async def _has_unsealed(self) -> bool:
        """A cheap read first, so an idle round takes no turn."""
        async with self._db.connect() as conn:
            mark = await watermark(conn)
            below = await horizon(conn)
            found = await conn.scalar(
                sa.select(audit_events.c.id).where(above_watermark(mark), audit_events.c.txid < below).limit(1)
            )
        return found is not None

    async def seal_pending(self, *, wait: bool = True, max_batches: int | None = None) -> int:
        """Seal until nothing is left (or ``max_batches``); the number of rows sealed."""
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            batch = await self._seal_round(wait=wait)
            batches += 1
            if batch is None:
                break
            total += batch.sealed
            if batch.read < self._batch_size:
                break
        return total

    def start(self) -> None:
        if self._interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="audit-sealer")

    async def _loop(self) -> None:
        while True:
            try:
                sealed = await self.seal_pending(wait=False, max_batches=10)
                if sealed:
                    log.debug("audit_sealed", rows=sealed)
            except asyncio.CancelledError:
                raise
            except Exception:  # the next round tries again; the hot path never waits for this
                log.exception("audit_seal_failed")
            await asyncio.sleep(self._interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
