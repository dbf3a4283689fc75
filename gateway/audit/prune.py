"""``gateway audit prune --older-than 90d``: retention that keeps the chain verifiable.

Only a prefix of a tenant's sealed chain is removed: every row up to the last position
before the first sealed row that is still young enough to keep (so no row newer than the
cut-off is ever removed, and no hole is made in the chain). The chain hash of the last
removed row becomes the tenant's anchor in ``audit_chains``: ``audit verify`` starts from
it. Rows not sealed yet are never pruned (they are sealed and pruned in a later run).
The prune itself is audited in the tenant's chain, and it takes the sealers' lock so that
no batch is sealed meanwhile. The database deletes only rows behind the anchor (a trigger,
migration 0008): the anchor moves first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.chain import audit_events
from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import audit_chains, take_turn
from gateway.db.engine import Database

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")


def parse_age(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w``."""
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"{text!r} is not an age like 90d, 12h, 30m or 2w")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True, slots=True)
class PruneResult:
    tenant_id: str
    removed_rows: int
    anchor_seq: int


async def prune_tenant(conn: AsyncConnection, *, tenant_id: str, cutoff: datetime, now: datetime) -> PruneResult:
    chain = (await conn.execute(sa.select(audit_chains).where(audit_chains.c.tenant_id == tenant_id))).first()
    if chain is None:
        return PruneResult(tenant_id, 0, 0)
    sealed = sa.and_(audit_events.c.tenant_id == tenant_id, audit_events.c.chain_seq.is_not(None))
    first_kept = await conn.scalar(
        sa.select(sa.func.min(audit_events.c.chain_seq)).where(sealed, audit_events.c.created_at >= cutoff)
    )
    cut = (first_kept - 1) if first_kept is not None else chain.head_seq
    if cut <= chain.anchor_seq:
        return PruneResult(tenant_id, 0, chain.anchor_seq)
    anchor_hash = await conn.scalar(
        sa.select(audit_events.c.chain_hash).where(sealed, audit_events.c.chain_seq == cut)
    )
    if anchor_hash is None:
        raise RuntimeError(f"the chain of {tenant_id!r} has no row at position {cut}; run `gateway audit verify`")
    behind_anchor = sa.and_(sealed, audit_events.c.chain_seq <= cut)
    # The anchor moves first: the database deletes only rows already behind their tenant's
    # anchor (migration 0008), so no row leaves the chain without the anchor vouching for it.
    await conn.execute(
        sa.update(audit_chains)
        .where(audit_chains.c.tenant_id == tenant_id)
        .values(
            anchor_seq=cut,
            anchor_hash=anchor_hash,
            pruned_rows=audit_chains.c.pruned_rows
            + sa.select(sa.func.count()).where(behind_anchor).scalar_subquery(),
            updated_at=now,
        )
    )
    removed = await conn.execute(sa.delete(audit_events).where(behind_anchor))
    await append_audit(
        conn,
        AuditRow(
            tenant_id=tenant_id,
            kind="audit_prune",
            outcome="OK",
            created_at=now,
            detail={"removed_rows": removed.rowcount, "through_chain_seq": cut, "older_than": cutoff.isoformat()},
        ),
    )
    return PruneResult(tenant_id, removed.rowcount, cut)


async def prune(db: Database, *, older_than: timedelta, tenant_id: str | None = None) -> list[PruneResult]:
    now = datetime.now(UTC)
    cutoff = now - older_than
    async with db.begin() as conn:
        await take_turn(conn, wait=True)
        if tenant_id is not None:
            tenants = [tenant_id]
        else:
            tenants = list((await conn.execute(sa.select(audit_chains.c.tenant_id))).scalars())
        return [await prune_tenant(conn, tenant_id=t, cutoff=cutoff, now=now) for t in sorted(tenants)]
