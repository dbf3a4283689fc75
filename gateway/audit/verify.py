"""``gateway audit verify``: walk a tenant's chain and name the first broken row.

Checks, for every link after the chain's start in chain order (``audit_links``, read in keyset
chunks joined to their audit rows, never all at once): its position follows the previous one
with no gap, its audit row is there (or, at the boundary a prune left, its month's partition
is gone) and its
content still hashes to its ``content_hash``, its ``prev_hash`` is the previous row's chain
hash (the stored start's hash for the first one), and its ``chain_hash`` links the two. The
last row must be the head the sealer stored. Rows not sealed yet (above the sealer's
watermark, without a link) are counted and reported with the age of the oldest, not judged. A
row's link carries its ``created_at``, so each lookup of a row touches only the partition of
its month.

The stored start (``audit_chains.anchor_seq`` and its hash) is trusted only for what is gone:
no link may be left at or before it (a prune deletes them all, and keeps every row after it
chained: ``gateway/audit/prune.py``), and a start after position 0 must be the one the
tenant's last ``audit_prune`` record names, and hash to the link the prune removed there, whose
time lies in a dropped month (``_unproven_start``). Anyone who can write to the database can
move the stored start; they cannot move it over rows still there, nor over rows of a month
still kept that they deleted with their links.

With a signed anchor (``gateway/audit/anchor.py``) it also checks that the row at the
anchor's position still has the chain hash the anchor signed: the stored head can be
recomputed by anyone who can write to the database, the anchor cannot.

Read it in one snapshot (``REPEATABLE READ``): a sealer may move the head meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.anchor import Anchor
from gateway.audit.chain import CANONICAL_COLUMNS, audit_events, audit_links, content_hash, genesis_hash, link_hash
from gateway.audit.sealer import above_watermark, audit_chains, unsealed, watermark

CHUNK = 2000
YIELD_EVERY = 200
BOUNDARY = timedelta(days=1)
"""How long after a month began a row of it may be sealed before a row of the month before (a
transaction open across the boundary; the default timeouts bound it to minutes, and a
transaction open longer than this would make verify report a real prune as broken)."""

_OLDEST_PARTITION = sa.text(
    r"""
    WITH bounds AS (
        SELECT substring(pg_get_expr(c.relpartbound, c.oid) FROM $$FROM \('([^']*)'\)$$)::timestamptz AS lower
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'audit_events'::regclass
    )
    SELECT least(
               (SELECT min(lower) FROM bounds),
               (SELECT date_trunc('month', min(d.created_at), 'UTC') FROM audit_events_default d)
           ),
           coalesce((SELECT bool_and(lower = date_trunc('month', lower, 'UTC')) FROM bounds WHERE lower IS NOT NULL),
                    true)
    """
)
"""Where the oldest month still kept begins: the oldest partition of ``audit_events`` still
attached, by its bounds, or the month of the oldest row in the default partition (which has
none); and whether every partition begins at a month's start (only then do its bounds say
which months are gone)."""


def _unproven_start(
    chain: Any, start_seq: int, start_hash: str, kept_from: datetime | None, anchor: Anchor | None
) -> str | None:
    """Why the stored start (after position 0) cannot be a prune's, or None.

    A prune keeps the link it removed at the start (migration 0024): the start's hash must be
    that link's, and the link's time before the oldest month kept — which only dropping that
    month's partition moves, and never over rows of a month still kept. A start an earlier
    release moved keeps no link: it is taken as it stands, but not where a signed anchor that
    names the start shows that it moved since."""
    version = chain.start_hash_version
    if chain.start_linked_at is None or version == 1:
        # No link kept (an earlier release's prune), or one whose hash does not cover its time.
        if anchor is not None and anchor.start_seq is not None and (anchor.start_seq, anchor.start_hash) != (
            start_seq, start_hash
        ):
            return (
                f"the chain's start moved from position {anchor.start_seq}, where the signed anchor saw it, to "
                f"{start_seq}, and keeps no link of a dropped month's row whose time its hash covers"
            )
        if chain.start_linked_at is None:
            return None
    try:
        kept_link = link_hash(start_seq, chain.start_prev_hash, chain.start_content_hash, chain.start_linked_at, version)
    except (ValueError, TypeError):  # a version no release wrote, a time without a zone, a field missing
        kept_link = None
    if kept_link != start_hash:
        return "the chain's start does not hash to the link it keeps: the start or that link was changed"
    if version != 1 and kept_from is not None and chain.start_linked_at >= kept_from:
        return (
            f"the chain's start is the link of a row written {chain.start_linked_at.isoformat()}, in a month still "
            f"kept (from {kept_from.isoformat()}): a prune moves the start only over months it drops"
        )
    return None


@dataclass(frozen=True, slots=True)
class LastPrune:
    through_chain_seq: int
    """The chain's start it left."""


async def last_prune(conn: AsyncConnection, tenant_id: str) -> LastPrune | None:
    """What the tenant's last ``audit_prune`` record says (``None`` without one, or if it is
    not one a prune wrote). A record anyone who can write rows could have written: it is
    held against the start, never taken as proof that a row is gone."""
    a = audit_events.c
    detail = await conn.scalar(
        sa.select(a.detail).where(a.tenant_id == tenant_id, a.kind == "audit_prune").order_by(a.id.desc()).limit(1)
    )
    try:
        seq = detail["through_chain_seq"]
    except (TypeError, KeyError):
        return None
    return LastPrune(seq) if type(seq) is int else None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    tenant_id: str
    verified_rows: int
    unsealed_rows: int
    anchor_seq: int
    head_seq: int
    head_hash: str = ""
    broken_row_id: int | None = None
    broken_seq: int | None = None
    reason: str | None = None
    oldest_unsealed_at: datetime | None = None
    checked_at: datetime | None = None
    signed_anchor: Anchor | None = None
    """The signed anchor checked too, if one was given."""
    broken_at: str | None = None
    """What broke when it is no row: the chain head (default), its start or the signed anchor."""
    pruned_rows: int = 0
    """Of the rows verified, those whose month was dropped: checked by their links."""
    start_hash: str = ""
    """The chain hash the chain starts from (at ``anchor_seq``)."""

    @property
    def ok(self) -> bool:
        return self.reason is None

    def _unsealed(self) -> str:
        text = f"{self.unsealed_rows} row(s) not sealed yet"
        if self.oldest_unsealed_at is not None and self.checked_at is not None:
            age = max(0, int((self.checked_at - self.oldest_unsealed_at).total_seconds()))
            text += f" (the oldest written {self.oldest_unsealed_at.isoformat()}, {age} s ago)"
        return text

    def describe(self) -> str:
        unsealed = self._unsealed()
        if self.ok:
            span = (
                f"chain positions {self.anchor_seq + 1}..{self.head_seq}" if self.verified_rows else "no sealed rows"
            )
            if self.pruned_rows:
                span += f"; {self.pruned_rows} of them pruned, checked by their links"
            anchored = ""
            if self.signed_anchor is not None:
                anchored = (
                    f"; unchanged up to the signed anchor at chain position {self.signed_anchor.chain_seq} "
                    f"(taken {self.signed_anchor.issued_at.isoformat()})"
                )
            return (
                f"tenant {self.tenant_id}: OK, {self.verified_rows} sealed row(s) verified ({span}){anchored}; "
                f"{unsealed}"
            )
        where = f"row id {self.broken_row_id}" if self.broken_row_id is not None else self.broken_at or "the chain head"
        seq = f" (chain position {self.broken_seq})" if self.broken_seq is not None else ""
        return (
            f"tenant {self.tenant_id}: BROKEN at {where}{seq}: {self.reason}; "
            f"{self.verified_rows} row(s) before it verified; {unsealed}"
        )


async def verify_chain(conn: AsyncConnection, *, tenant_id: str, anchor: Anchor | None = None) -> VerifyReport:
    checked_at = datetime.now(UTC)
    mark = await watermark(conn)
    unsealed_count, oldest_unsealed_at = (
        await conn.execute(
            sa.select(sa.func.count(), sa.func.min(audit_events.c.created_at))
            .select_from(audit_events)
            .where(audit_events.c.tenant_id == tenant_id, unsealed(mark))
        )
    ).one()
    pending = int(unsealed_count or 0)
    chain = (await conn.execute(sa.select(audit_chains).where(audit_chains.c.tenant_id == tenant_id))).first()
    if chain is None:
        anchor_seq, anchor_hash, head_seq, head_hash = 0, genesis_hash(tenant_id), 0, genesis_hash(tenant_id)
    else:
        anchor_seq, anchor_hash = chain.anchor_seq, chain.anchor_hash
        head_seq, head_hash = chain.head_seq, chain.head_hash

    pruned = await last_prune(conn, tenant_id)

    def broken(row_id: int | None, seq: int | None, reason: str, verified: int, at: str | None = None) -> VerifyReport:
        return VerifyReport(
            tenant_id=tenant_id, verified_rows=verified, unsealed_rows=pending, anchor_seq=anchor_seq,
            head_seq=head_seq, head_hash=head_hash, broken_row_id=row_id, broken_seq=seq, reason=reason,
            oldest_unsealed_at=oldest_unsealed_at, checked_at=checked_at, signed_anchor=anchor, broken_at=at,
            start_hash=anchor_hash,
        )

    def differs_from_anchor(row_id: int | None, verified: int) -> VerifyReport:
        assert anchor is not None
        return broken(
            row_id, anchor.chain_seq,
            f"its chain hash is not the one the signed anchor of {anchor.issued_at.isoformat()} holds: a row at or "
            "before this position was changed, removed or inserted since, and the later hashes recomputed",
            verified, "the signed anchor",
        )

    if anchor is not None and anchor.chain_seq <= anchor_seq:
        if anchor.chain_seq < anchor_seq:
            return broken(
                None, anchor.chain_seq,
                f"the signed anchor's position was pruned (the chain now starts after position {anchor_seq}); "
                "it proves nothing about the rows kept: take a new anchor",
                0, "the signed anchor",
            )
        if anchor.chain_hash != anchor_hash:
            return differs_from_anchor(None, 0)

    a, link = audit_events.c, audit_links.c
    behind = (
        await conn.execute(
            sa.select(link.audit_id, link.chain_seq)
            .where(link.tenant_id == tenant_id, link.chain_seq <= anchor_seq)
            .order_by(link.chain_seq)
            .limit(1)
        )
    ).first()
    if behind is not None:
        return broken(
            behind.audit_id, behind.chain_seq,
            f"its link lies at or before the chain's stored start (position {anchor_seq}), where a prune leaves "
            "none: the start was moved over rows still there, which are no longer chained",
            0,
        )

    # A link without its row is a pruned row's only while the chain is still at the boundary
    # the prune left: before the oldest month kept (its partition, read by its bounds, which
    # no record or renaming can forge, is gone), before any row of a kept month written a
    # day or more after that month began (only rows sealed out of order across the boundary
    # come before pruned ones), and after the row the prune kept just past the start (the
    # first link after the start always has its row: a prune that leaves links of pruned rows
    # puts the start just below the kept row they follow).
    kept_from, months_aligned = (await conn.execute(_OLDEST_PARTITION)).one()
    if not months_aligned:
        return broken(
            None, anchor_seq,
            "a partition of audit_events does not begin at a month's start: its bounds were changed, and no "
            "longer say which months were dropped",
            0, "the audit's partitions",
        )
    if anchor_seq:
        moved = _unproven_start(chain, anchor_seq, anchor_hash, kept_from, anchor)
        if moved is not None:
            return broken(None, anchor_seq, moved, 0, "the chain's start")
    settled = False
    expected_seq, prev = anchor_seq + 1, anchor_hash
    verified = pruned_rows = 0
    after: int | None = None
    columns = (
        *CANONICAL_COLUMNS, link.audit_id, link.created_at.label("linked_at"), link.chain_seq, link.content_hash,
        link.prev_hash, link.chain_hash, link.hash_version,
    )
    joined = audit_links.outerjoin(
        audit_events, sa.and_(a.tenant_id == link.tenant_id, a.id == link.audit_id, a.created_at == link.created_at)
    )
    while True:
        stmt = sa.select(*columns).select_from(joined).where(
            link.tenant_id == tenant_id, link.chain_seq > (after if after is not None else anchor_seq)
        )
        rows = (await conn.execute(stmt.order_by(link.chain_seq).limit(CHUNK))).all()
        for done, row in enumerate(rows, start=1):
            if done % YIELD_EVERY == 0:
                # Hashing is CPU work; in a serving process (the console's verify) it shares the
                # event loop with requests: let them in between.
                await asyncio.sleep(0)
            if row.chain_seq != expected_seq:
                reason = f"expected chain position {expected_seq}, found {row.chain_seq} (rows before it are missing)"
                return broken(row.audit_id, row.chain_seq, reason, verified)
            if row.id is None:
                moved = await conn.scalar(
                    sa.select(sa.func.count()).where(a.tenant_id == tenant_id, a.id == row.audit_id)
                )
                dropped = (pruned is not None and kept_from is not None and row.linked_at < kept_from
                           and row.chain_seq != anchor_seq + 1)
                if moved or not dropped or settled:
                    reason = (
                        "its content does not match its content hash" if moved
                        else "its audit row is missing (the link is there, the row is not)"
                    )
                    return broken(row.audit_id, row.chain_seq, reason, verified)
                pruned_rows += 1  # its month was dropped: the link still chains the rows around it
            elif content_hash(row) != row.content_hash:
                return broken(row.id, row.chain_seq, "its content does not match its content hash", verified)
            elif kept_from is None or row.linked_at >= kept_from + BOUNDARY:
                settled = True  # past the months' boundary: every row from here on is there
            if row.prev_hash != prev:
                return broken(row.audit_id, row.chain_seq, "its previous-row hash does not match the row before it",
                              verified)
            if link_hash(row.chain_seq, prev, row.content_hash, row.linked_at, row.hash_version) != row.chain_hash:
                return broken(row.audit_id, row.chain_seq,
                              "its chain hash does not link its content to the row before it", verified)
            if anchor is not None and row.chain_seq == anchor.chain_seq and row.chain_hash != anchor.chain_hash:
                return differs_from_anchor(row.audit_id, verified)
            prev = row.chain_hash
            expected_seq += 1
            verified += 1
        if len(rows) < CHUNK:
            break
        after = rows[-1].chain_seq
    last_seq = expected_seq - 1
    # Every row the sealer has passed has a link: one without was never sealed (written behind
    # the sealer's back) or lost it (a link removed with a moved anchor).
    unlinked = await conn.scalar(
        sa.select(a.id)
        .where(
            a.tenant_id == tenant_id,
            sa.not_(above_watermark(mark)),
            ~sa.exists().where(link.tenant_id == a.tenant_id, link.audit_id == a.id, link.created_at == a.created_at),
        )
        .limit(1)
    )
    if unlinked is not None:
        return broken(
            unlinked, None,
            "it has no link although the sealer has passed it: it was never sealed into the chain, or its link "
            "was removed",
            verified,
        )
    if anchor_seq and (pruned is None or pruned.through_chain_seq != anchor_seq):
        return broken(
            None, anchor_seq,
            f"the chain starts after position {anchor_seq}, but no prune recorded that start (the tenant's last "
            "audit_prune row names "
            + ("none" if pruned is None else f"position {pruned.through_chain_seq}") + ")",
            verified, "the chain's start",
        )
    if anchor is not None and anchor.chain_seq > last_seq:
        return broken(
            None, anchor.chain_seq,
            f"the chain ends at position {last_seq}, before the signed anchor's position (rows were removed)",
            verified, "the signed anchor",
        )
    if last_seq != head_seq or prev != head_hash:
        return broken(
            None, head_seq,
            f"the chain ends at position {last_seq} but the sealed head is at {head_seq} (rows at the end are missing)"
            if last_seq < head_seq else "the last row does not match the sealed head",
            verified,
        )
    return VerifyReport(
        tenant_id=tenant_id, verified_rows=verified, unsealed_rows=pending, anchor_seq=anchor_seq,
        head_seq=head_seq, head_hash=head_hash, oldest_unsealed_at=oldest_unsealed_at, checked_at=checked_at,
        signed_anchor=anchor, pruned_rows=pruned_rows, start_hash=anchor_hash,
    )
