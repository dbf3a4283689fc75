"""The sealer: links unsealed audit rows into their tenant's hash chain, off the request path.

The hot path only inserts audit rows. A sealer runs in every gateway process (and as
``gateway audit seal``); the processes take turns through a transaction-level
advisory lock (``pg_try_advisory_xact_lock``): whoever holds it seals one batch — the
oldest unsealed rows in id order — and releases it at commit; the others skip that round.
Per tenant, each row gets the next ``chain_seq``, its content hash, the previous row's chain
hash and its own, and the tenant's head in ``audit_chains`` moves on in the same
transaction. Even without the lock two sealers could not both win: a row is only sealed
while ``chain_seq IS NULL``, a head only moves from the value it was read at, and
``(tenant_id, chain_seq)`` is unique; a lost race rolls back and is tried again.

A row that commits after higher ids were sealed (its transaction was slower) is simply
sealed in a later batch: the chain's order is the order of sealing, id order within a batch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.chain import CANONICAL_COLUMNS, audit_events, content_hash, genesis_hash, link_hash
from gateway.db.engine import Database
from gateway.db.models import AuditChain

log = structlog.get_logger("gateway.audit")

audit_chains = AuditChain.__table__

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


async def seal_batch(conn: AsyncConnection, *, batch_size: int) -> int:
    """Seal up to ``batch_size`` of the oldest unsealed rows; the caller holds the turn."""
    rows = (
        await conn.execute(
            sa.select(*CANONICAL_COLUMNS)
            .where(audit_events.c.chain_seq.is_(None))
            .order_by(audit_events.c.id)
            .limit(batch_size)
        )
    ).all()
    if not rows:
        return 0
    by_tenant: dict[str, list[sa.Row]] = {}
    for row in rows:
        by_tenant.setdefault(row.tenant_id, []).append(row)
    now = datetime.now(UTC)
    updates = []
    for tenant_id, tenant_rows in sorted(by_tenant.items()):
        state = await chain_state(conn, tenant_id)
        seq, prev = state.head_seq, state.head_hash
        for done, row in enumerate(tenant_rows, start=1):
            if done % YIELD_EVERY == 0:
                # Hashing is CPU work on the serving event loop: let requests in between.
                await asyncio.sleep(0)
            seq += 1
            content = content_hash(row)
            link = link_hash(seq, prev, content)
            updates.append({"row_id": row.id, "seq": seq, "content": content, "prev": prev, "link": link})
            prev = link
        await _move_head(conn, tenant_id, state, seq, prev, now)
    sealed = await _write_links(conn, updates)
    if sealed not in (-1, len(updates)):
        raise ChainRaced("rows were sealed by another sealer meanwhile")
    return len(updates)


_LINK_ROWS = sa.text(
    """
    UPDATE audit_events AS a
       SET chain_seq = v.seq, content_hash = v.content, prev_hash = v.prev, chain_hash = v.link
      FROM unnest(CAST(:ids AS bigint[]), CAST(:seqs AS bigint[]), CAST(:contents AS text[]),
                  CAST(:prevs AS text[]), CAST(:links AS text[])) AS v(id, seq, content, prev, link)
     WHERE a.id = v.id AND a.chain_seq IS NULL
    """
)


async def _write_links(conn: AsyncConnection, updates: list[dict[str, Any]]) -> int:
    """One set-based statement (a statement per row costs the server several times more)."""
    result = await conn.execute(
        _LINK_ROWS,
        {
            "ids": [u["row_id"] for u in updates],
            "seqs": [u["seq"] for u in updates],
            "contents": [u["content"] for u in updates],
            "prevs": [u["prev"] for u in updates],
            "links": [u["link"] for u in updates],
        },
    )
    return int(result.rowcount)


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

    async def seal_once(self, *, wait: bool = False) -> int | None:
        """One batch in one transaction; ``None`` when another process holds the turn."""
        if not await self._has_unsealed():
            return 0
        try:
            async with self._db.begin() as conn:
                if not await take_turn(conn, wait=wait):
                    return None
                return await seal_batch(conn, batch_size=self._batch_size)
        except (ChainRaced, sa_exc.IntegrityError):
            log.info("audit_seal_raced")
            return 0

    async def _has_unsealed(self) -> bool:
        """A cheap read first, so an idle round takes no turn."""
        async with self._db.connect() as conn:
            found = await conn.scalar(
                sa.select(audit_events.c.id).where(audit_events.c.chain_seq.is_(None)).limit(1)
            )
        return found is not None

    async def seal_pending(self, *, wait: bool = True, max_batches: int | None = None) -> int:
        """Seal until nothing is left (or ``max_batches``); the number of rows sealed."""
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            sealed = await self.seal_once(wait=wait)
            batches += 1
            if sealed is None:
                break
            total += sealed
            if sealed < self._batch_size:
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
